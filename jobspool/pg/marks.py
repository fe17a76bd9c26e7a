"""Schedule marks on PostgreSQL: the last fired tick of each schedule, one row each.

Shared by every machine (a file spool's `schedules.json` is per directory, and a
database spool's local directory is per machine): a tick fired and pruned on one
machine is never fired again on another. Read and rewritten in one transaction under
an advisory lock, so concurrent schedulers take turns.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from jobspool.queue.marks import RULE_MARK

if TYPE_CHECKING:
    import psycopg

    from jobspool.pg.core import PgCore

_LOCK_KEY = 0x6A6F6274  # the advisory lock schedulers take turns under


def read(spool: PgCore, *, rules: bool = False) -> dict[str, int]:
    """The last tick per schedule name; with `rules`, the rule fingerprints kept beside
    them too (rows named with `RULE_MARK`)."""
    rows = spool.db.run(lambda c: c.execute(
        "SELECT name, last_tick FROM jobspool_schedule_marks").fetchall(),
        what="reading schedule marks")
    return {name: int(tick) for name, tick in rows if rules or not name.endswith(RULE_MARK)}


@contextmanager
def held(spool: PgCore) -> Iterator[dict[str, int]]:
    """The marks, locked for the block; whatever the block leaves in the dict is saved.
    As on the file store, a mark may move back: `Schedule.plan` starts over from a mark a
    clock that jumped ahead left in the future, and a mark kept at the greater of the two
    silenced catch-up until the real clock reached it (a year, after a one-year jump)."""
    def begin(conn: psycopg.Connection[Any]) -> dict[str, int]:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        return {name: int(tick) for name, tick in conn.execute(
            "SELECT name, last_tick FROM jobspool_schedule_marks").fetchall()}

    with spool.db.block(begin, what="reading schedule marks") as (conn, marks):
        before = dict(marks)
        with spool.db.pinned(conn):
            yield marks
        # A connection lost here killed a worker with the driver's raw error (its schedule
        # loop takes the store's errors in its stride, not psycopg's).
        with spool.db.one_line_errors("saving schedule marks (rolled back)"):
            for name, tick in marks.items():
                if before.get(name) != tick:
                    conn.execute(
                        "INSERT INTO jobspool_schedule_marks (name, last_tick) VALUES (%s, %s) "
                        "ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick",
                        (name, tick))
