"""A statement the PostgreSQL server picks as a deadlock's victim is sent again.

Found by a producers probe: producers replacing (enqueue_many, on_conflict="replace") and
canceling the ids a worker was settling locked the rows in id order while the settle locked
them in its plan's order; the server broke the deadlock by failing the settle, and a whole
batch of finished jobs stayed leased, to run again after their leases expired. Deadlocks
(and serialization failures) roll the statement back whole, so the store sends it again,
as it does after a lost connection: every statement it sends is guarded or a read."""

from __future__ import annotations

import threading

import psycopg

from jobspool.pg.db import Database
from tests.waiting import wait_until


def test_a_deadlocks_victim_is_sent_again_and_succeeds(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE rows_to_lock (id int PRIMARY KEY)")
        setup.execute("INSERT INTO rows_to_lock VALUES (1), (2)")
    db = Database(pg_url)
    calls: list[int] = []
    got: list[object] = []

    def lock_one_then_two(conn: psycopg.Connection[object]) -> int:
        calls.append(1)
        with conn.transaction():
            conn.execute("SELECT 1 FROM rows_to_lock WHERE id = 1 FOR UPDATE")
            conn.execute("SELECT 1 FROM rows_to_lock WHERE id = 2 FOR UPDATE")
        return len(calls)

    other = psycopg.connect(pg_url)
    try:
        # The other side detects late, so the store's statement is the victim.
        other.execute("SET deadlock_timeout = '30s'")
        other.execute("SELECT 1 FROM rows_to_lock WHERE id = 2 FOR UPDATE")  # holds row 2
        runner = threading.Thread(
            target=lambda: got.append(db.run(lock_one_then_two, what="locking")))
        runner.start()

        def waiting() -> bool:
            row = other.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
            return bool(row and row[0])
        wait_until(waiting, 60, "the store's statement to wait for row 2")
        # Row 1 next: a cycle. The server fails the store's statement; it goes again.
        other.execute("SELECT 1 FROM rows_to_lock WHERE id = 1 FOR UPDATE")
        other.commit()
        runner.join(60)
    finally:
        other.close()
        db.close()
    assert got == [2]  # rolled back once, then done
