"""A minimal SQLite job queue: what a user would write instead of jobspool.

WAL with ``synchronous=FULL`` (every commit is flushed before it returns), one
row per job, claim as one ``UPDATE … RETURNING`` inside ``BEGIN IMMEDIATE`` (so
two processes can never claim the same row), a lease token checked on
completion, and completion as a ``DELETE``.

Two shapes are measured. ``sqlite_min`` (``per_job=True``, the ratio reference)
commits once per enqueue, per claim and per completion of a single job: the
queue a user writes in twenty lines, and the one PERF-NOTES measured.
``sqlite_min_batch`` takes the same batches as jobspool, one commit per
``enqueue``/``claim``/``complete`` call: the like-for-like bound, which no file
queue can reach on a disk where each new file costs more than a WAL append.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from bench.peers.base import Adapter, Claimed, dumps, loads, payload

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id          INTEGER PRIMARY KEY,
    kind        TEXT    NOT NULL,
    payload     BLOB    NOT NULL,
    state       INTEGER NOT NULL,          -- 0 ready, 1 leased
    owner       TEXT,
    token       INTEGER,
    lease_until REAL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    created_at  REAL    NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (state, id);
"""

CLAIM = """
UPDATE jobs SET state = 1, owner = ?, token = ?, lease_until = ?, attempts = attempts + 1
WHERE id IN (SELECT id FROM jobs WHERE state = 0 ORDER BY id LIMIT ?)
RETURNING id, payload, token
"""


def check_available() -> None:
    if sqlite3.sqlite_version_info < (3, 35, 0):
        raise RuntimeError(f"SQLite {sqlite3.sqlite_version} has no UPDATE … RETURNING")


class SqliteMinAdapter(Adapter):
    def __init__(
        self,
        root: str,
        *,
        synchronous: str = "FULL",
        per_job: bool = False,
        lease_seconds: float = 600.0,
        **options: Any,
    ) -> None:
        super().__init__(root, **options)
        os.makedirs(root, exist_ok=True)
        # Autocommit mode: we issue BEGIN IMMEDIATE ourselves, so the write lock is
        # taken before the claim's SELECT and no two processes race on a row.
        self.db = sqlite3.connect(os.path.join(root, "queue.db"), isolation_level=None, timeout=60.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.executescript(SCHEMA)
        self.owner = f"{os.getpid()}"
        self.lease_seconds = lease_seconds
        self.token = 0
        self.per_job = per_job
        self.batched = not per_job

    def enqueue(self, ids: Sequence[int]) -> None:
        if self.per_job:
            for i in ids:
                self._enqueue([i])
        else:
            self._enqueue(ids)

    def claim(self, n: int) -> list[Claimed]:
        if not self.per_job:
            return self._claim(n)
        out: list[Claimed] = []
        for _ in range(n):
            got = self._claim(1)
            if not got:
                break
            out += got
        return out

    def complete(self, claimed: Sequence[Claimed]) -> list[int]:
        if not self.per_job:
            return self._complete(claimed)
        return [i for c in claimed for i in self._complete([c])]

    def prefill(self, ids: Sequence[int]) -> None:
        for k in range(0, len(ids), 1000):
            self._enqueue(ids[k : k + 1000])

    def _enqueue(self, ids: Sequence[int]) -> None:
        now = time.time()
        rows = [("bench", dumps(payload(i, self.pad)), now) for i in ids]
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany(
                "INSERT INTO jobs (kind, payload, state, created_at) VALUES (?, ?, 0, ?)", rows
            )
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _claim(self, n: int) -> list[Claimed]:
        self.token += 1
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rows = self.db.execute(
                CLAIM, (self.owner, self.token, time.time() + self.lease_seconds, n)
            ).fetchall()
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return [Claimed(loads(p)["i"], (rowid, token)) for rowid, p, token in rows]

    def _complete(self, claimed: Sequence[Claimed]) -> list[int]:
        done: list[int] = []
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for c in claimed:
                rowid, token = c.handle
                cur = self.db.execute(
                    "DELETE FROM jobs WHERE id = ? AND state = 1 AND owner = ? AND token = ?",
                    (rowid, self.owner, token),
                )
                if cur.rowcount == 1:  # 0: the lease was lost (fencing)
                    done.append(c.i)
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return done

    def close(self) -> None:
        self.db.close()
