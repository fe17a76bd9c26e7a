"""The fencing tokens on PostgreSQL: the sequence's value, raising it, the live ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobspool.errors import SpoolError
from jobspool.pg.schema import FENCE_GONE, FENCE_REL

if TYPE_CHECKING:
    from jobspool.pg.core import PgCore as PgSpool


def fence_value(spool: PgSpool) -> int:
    """The last token handed out (0 before the first claim).

    A role granted SELECT on the tables alone may not read the sequence: `stats`, `fsck`
    and `health` failed for it ("reading commands work with SELECT alone"). It gets the
    highest token the jobs still hold, a lower bound (GRANT SELECT ON SEQUENCE
    jobspool_fence for the exact value)."""
    row = spool.db.run(lambda c: c.execute(_FENCE_VALUE).fetchone(), what="reading the fence")
    if row is not None and row[0] is None:
        raise SpoolError(f"{spool.display}: {FENCE_GONE}")
    return int(row[0]) if row else 0


# pg_sequence_last_value is called only when the role may read the sequence: a plain
# SELECT from it is checked before anything runs, whatever the CASE around it says. Its
# argument is looked up when the row is read, not when the text is parsed, so that a
# missing sequence reads as NULL (named in one line) rather than a parse error.
_FENCE_VALUE = """
SELECT CASE WHEN f.rel IS NOT NULL THEN COALESCE(
  CASE WHEN has_sequence_privilege(f.rel, 'SELECT')
       THEN COALESCE(pg_sequence_last_value(f.rel::regclass), 0) END,
  (SELECT COALESCE(max(token), 0) FROM jobspool_jobs)) END
FROM (SELECT """ + FENCE_REL + """ AS rel) AS f
"""


def live_tokens(spool: PgSpool) -> list[int]:
    """Tokens of every unexpired lease."""
    rows = spool.db.run(lambda c: c.execute(
        "SELECT token FROM jobspool_jobs WHERE state = 'leased' AND expires_at > %s",
        (spool.now(),)).fetchall(), what="reading leases")
    return [int(r[0]) for r in rows]


def keep_tokens_above(spool: PgSpool, token: int) -> bool:
    """Raise the token sequence to `token` when it is below (never lowers it)."""
    row = spool.db.run(lambda c: c.execute(
        "SELECT setval('jobspool_fence', %s::bigint) FROM jobspool_fence "
        "WHERE (CASE WHEN is_called THEN last_value ELSE 0 END) < %s::bigint",
        (token, token)).fetchone(), what="raising the fence")
    return row is not None
