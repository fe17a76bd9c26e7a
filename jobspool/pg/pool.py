"""The connection pool of a `Database` (`db.py`): bounded, LIFO, made on demand."""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from jobspool.errors import SpoolClosed

# psycopg prepares a statement on the server after this many uses on one connection:
# the claim, settle and insert statements are sent thousands of times.
PREPARE_THRESHOLD = 2
CONNECT_TIMEOUT = 5
# Every pooled connection plans without bitmap scans. A claim looks for expired leases
# through the `leased` partial index, whose entries of jobs settled since the last vacuum
# are dead; a bitmap scan visits their heap pages on every claim and never marks them dead
# (1,877 dead entries, 736 heap pages, a third of a claim's 3.5 ms after 5,000 jobs), where
# an index scan marks each dead once and skips it after (the same claim: 2.1 ms).
# And it plans prepared statements once, generically: the claim and settle statements are
# the same shape every time (states, limits and kind filters written in, `claim_sql`), so
# the custom plans PostgreSQL would otherwise make first and keep comparing against buy
# nothing (the batched Worker: +3% jobs/s, 14,845 against 14,359, 3 interleaved rounds).
# Statements must therefore never bind a state as a parameter (admin.py writes it in).
SESSION = "SET enable_bitmapscan = off; SET plan_cache_mode = force_generic_plan"
_IDLE = psycopg.pq.TransactionStatus.IDLE

# Every connection jobspool made in this process, for `db._release_after_fork`.
CONNECTIONS: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()


# Frames a connection's opening needs below the recursion limit, with room to spare.
CONNECT_FRAMES = 200


def _room_to_connect() -> None:
    """Refuse, before anything is opened, to connect from a stack near its recursion limit
    (a handler deep in a recursion that catches RecursionError and goes on): the driver
    raised it part-way through its own connect, and the connection it had opened was
    never closed ("deleted while still open")."""
    room = sys.getrecursionlimit()
    frame = inspect.currentframe()
    while frame is not None and room > CONNECT_FRAMES:
        room -= 1
        frame = frame.f_back
    if room <= CONNECT_FRAMES:
        raise RecursionError("maximum recursion depth exceeded: no room left on this "
                             "thread's stack to open a database connection")


class PoolExhausted(Exception):
    """Every connection of the pool stayed busy for the whole wait."""


class Pool:
    """A bounded LIFO pool of autocommit connections, made on demand.

    Why not psycopg_pool: measured on the one-job enqueue (bench/pg.py), its
    checkout and return cost ~20% of the statement's own time, and it hands
    connections out in rotation, so a thread alternates between cold ones.
    Here a checkout is one lock and a list pop; the most recently returned
    (warm, its statements prepared) connection goes out first; a connection
    that broke (server restart, killed backend) is dropped on return, and the
    next checkout connects afresh — `Database.run` retries the statement.
    """

    def __init__(self, url: str, size: int, display: str = "") -> None:
        self.url = url
        self.size = size
        self.display = display or url
        self._idle: list[psycopg.Connection[Any]] = []
        self._busy = 0  # connections handed out (or being made); idle + busy <= size
        self._forsaken: set[int] = set()  # ids of connections out but no longer counted
        # Connections `give` could not close (the caller's stack at its recursion limit):
        # closed by the next call that can.
        self._unclosed: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self.closed = False

    def take(self, timeout: float) -> psycopg.Connection[Any]:
        """A connection: the most recently returned idle one, else a new one while fewer
        than `size` are out, else the first given back within `timeout` (`PoolExhausted`)."""
        self._close_unclosed()
        with self._lock:
            if (not self._idle and self._busy >= self.size and not self.closed
                    and not self._freed.wait_for(
                        lambda: self._idle or self._busy < self.size or self.closed, timeout)):
                raise PoolExhausted(f"no free connection within {timeout:g}s")
            if self.closed:
                # A thread that got the pool before `close()` connected afresh after it
                # and wrote once close had returned.
                raise SpoolClosed(self.display)
            self._busy += 1
            if self._idle:
                return self._idle.pop()
        made: psycopg.Connection[Any] | None = None
        try:
            _room_to_connect()
            made = psycopg.connect(self.url, autocommit=True,
                                   prepare_threshold=PREPARE_THRESHOLD,
                                   connect_timeout=CONNECT_TIMEOUT)
            CONNECTIONS.add(made)
            made.execute(SESSION)
            return made
        except BaseException:
            # Inline, no call of ours: at a stack's recursion limit a call raised again
            # before the slot was counted back.
            with self._lock:
                self._busy -= 1
                if made is not None:
                    self._unclosed.append(made)
                try:  # noqa: SIM105 (suppress() is a call of its own, which may raise here)
                    self._freed.notify()
                except RecursionError:
                    pass  # a taker waiting sees the slot when its wait times out
            raise

    def give(self, conn: psycopg.Connection[Any]) -> None:
        """Return a connection taken with `take`; a broken one (or one left inside a
        transaction) is closed instead of kept."""
        # (pgconn's status directly: `conn.info` builds an object per call, ~0.6 µs of a
        # ~25 µs one-job enqueue's client time)
        try:
            healthy = (not conn.closed and not conn.broken
                       and conn.pgconn.transaction_status == _IDLE)
        except BaseException:
            # These are Python calls: a handler deep in its recursion limit (one that
            # catches RecursionError and goes on) got the error here, before the slot was
            # counted back. Each such call leaked a slot for good; with all of them gone
            # every statement waited for a connection, and `close()` for ever.
            healthy = False
        with self._lock:
            if id(conn) in self._forsaken:  # its slot was given back already
                self._forsaken.discard(id(conn))
                healthy = False
            else:
                self._busy -= 1
            kept = healthy and not self.closed
            (self._idle if kept else self._unclosed).append(conn)
            # Woken after the books are right: at a stack's limit `notify` raised, and a
            # connection to close was dropped still open. A taker not woken sees the slot
            # when its wait times out.
            try:  # noqa: SIM105 (suppress() is a call of its own, which may raise here)
                self._freed.notify_all() if self.closed else self._freed.notify()
            except RecursionError:
                pass
        if not kept:
            self._close_unclosed()

    def _close_unclosed(self) -> None:
        while self._unclosed:
            with self._lock:
                if not self._unclosed:
                    return
                conn = self._unclosed.pop()
            try:
                conn.close()
            except psycopg.Error:
                pass
            except BaseException:
                with self._lock:
                    self._unclosed.append(conn)  # for a later call, with room to close it
                raise

    def forsake(self, conn: psycopg.Connection[Any]) -> None:
        """Give back the slot of a connection a thread still holds but will not use again
        (an abandoned handler's fenced block, its backend ended): each such block kept its
        slot until the handler's thread left it, and a dozen hung handlers used up the pool,
        every statement of the worker then waiting for a connection. Its `give`, if it ever
        comes, closes it."""
        with self._lock:
            if id(conn) in self._forsaken:
                return
            self._forsaken.add(id(conn))
            self._busy -= 1
            self._freed.notify()

    def drop_idle(self) -> None:
        """Close every idle connection: after one of them was found dead (a server restart,
        a killed backend) the others, made before it, most likely are too."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    @contextmanager
    def connection(self, timeout: float) -> Iterator[psycopg.Connection[Any]]:
        conn = self.take(timeout)
        try:
            yield conn
        finally:
            self.give(conn)

    def close(self, *, wait: bool = True) -> None:
        """Close, once the connections other threads have out are back (README: `close()`
        waits for the operations other threads have in flight): a statement or a `fenced`
        block running in another thread committed after close had returned. `wait=False`
        from inside the caller's own `fenced` block: the others may be waiting for that
        block's row lock, which goes only when the block ends, after close returns
        (waiting hung for ever). As on the file store, close does not wait then; what
        they have in flight finishes and its connection is closed."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
            self._freed.notify_all()  # takers waiting for a free connection: SpoolClosed
        for conn in idle:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        self._close_unclosed()
        if not wait:
            return
        with self._lock:
            self._freed.wait_for(lambda: self._busy == 0)
