"""The PostgreSQL store: the same `Spool` API on a database several machines share.

`Spool("postgresql://user@host:port/db")` returns a `PgSpool` (`jobspool.pg.spool`).
Jobs are rows of one table (`schema.py`); the state machine (`queue/machine.py`)
still decides every transition the store does not express as one guarded
statement. Needs the `postgres` extra: `pip install 'jobspool[postgres]'`.
"""

from __future__ import annotations

URL_SCHEMES = ("postgresql://", "postgres://")


def is_url(root: object) -> bool:
    """Whether `root` names a PostgreSQL database rather than a spool directory."""
    return isinstance(root, str) and root.startswith(URL_SCHEMES)
