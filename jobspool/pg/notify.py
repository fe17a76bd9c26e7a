"""Wakeups for idle workers on PostgreSQL: LISTEN/NOTIFY, as a hint only.

Producers send one NOTIFY per enqueue transaction (none on claim or settle).
An idle worker holds one connection of its own that LISTENs; it subscribes
before its first claim, so nothing committed after that claim goes unheard.
Notifications are not queued while no one listens, so after a reconnect the
watcher reports an arrival at once: the worker claims, and whatever was
enqueued during the outage is found. The worker's periodic safety poll
covers anything else (a lost notification, a due time passing).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from jobspool.errors import SpoolError

if TYPE_CHECKING:
    from jobspool.pg.db import Database

log = logging.getLogger("jobspool.pg")


class NotifyWatcher:
    """`DirWatcher`'s interface (`active`, `wait`, `close`) over LISTEN."""

    def __init__(self, db: Database, channel: str) -> None:
        self.db = db
        self.channel = channel
        self.conn: psycopg.Connection[Any] | None = None
        self._retry_at = 0.0
        self._closing = False
        self._said_down = False
        # Subscribed now: the first wait reports an arrival, so the worker claims once
        # more after LISTEN took effect and nothing enqueued before it is missed.
        self._fresh = self._listen()

    def _listen(self) -> bool:
        try:
            conn = self.db.connect()
            # Quoted as an identifier: a schema name holding '"' made a LISTEN that did not
            # parse, and idle workers polled for good.
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except (SpoolError, psycopg.Error) as exc:
            # Said once per outage, not at every retry (once a second per process, for as
            # long as the outage lasted).
            if not self._said_down:
                log.info("cannot LISTEN on %s (%s): idle workers poll until it is back",
                         self.db.display, exc)
                self._said_down = True
            self._retry_at = time.monotonic() + 1.0
            return False
        if self._said_down:
            log.info("LISTEN on %s again", self.db.display)
            self._said_down = False
        self.conn = conn
        return True

    @property
    def active(self) -> bool:
        # Active even while disconnected: wait() reconnects (and then reports an arrival).
        return True

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True when a job may have arrived."""
        if self._fresh:
            self._fresh = False
            return True
        if self.conn is None:
            if time.monotonic() < self._retry_at:
                time.sleep(min(timeout, self._retry_at - time.monotonic()))
                return False
            # Back after an outage: claim now, whatever arrived meanwhile was not heard.
            return self._listen()
        try:
            got = False
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                got = True
            return got
        except psycopg.Error as exc:
            if self._closing:  # closed by the worker's stop from another thread: no loss
                return False
            log.info("LISTEN connection to %s lost (%s): reconnecting", self.db.display,
                     str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            self._drop()
            self._retry_at = time.monotonic() + 0.2
            return False

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        self._closing = True
        self._drop()
