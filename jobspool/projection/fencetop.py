"""The highest fencing token a projection's rows hold: what a spool's counter must be above.

A projection row keeps the token of the write that made it, and a write with the default
version (its token) wins only when its token is at least the row's. An older backup of a
spool restored under a projection that newer runs wrote (a file spool copied back, a dump
restored into PostgreSQL) hands those tokens out again: every new run's write then lost to
the rows written after the backup, silently, until the counter passed them. A worker reads
this before its first claim and raises the spool's counter above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow.compute as pc

from jobspool.projection.handler import FENCE_COLUMN

if TYPE_CHECKING:
    from jobspool.projection.lance import ProjectionStore


def fence_top(store: ProjectionStore, floor: int, ceiling: int | None = None) -> int | None:
    """The highest fence any row of the store's tables holds above `floor` (tombstones
    included: they fence too) and at most `ceiling` when given, or None when none does."""
    top: int | None = None
    where = f"{FENCE_COLUMN} > {int(floor)}"
    if ceiling is not None:
        where += f" AND {FENCE_COLUMN} <= {int(ceiling)}"
    for name in store.table_names():
        tbl = store.open(name)
        if tbl is None or FENCE_COLUMN not in tbl.schema.names:
            continue
        found = (tbl.search().where(where)
                 .select([FENCE_COLUMN]).limit(None).to_arrow())
        if found.num_rows:
            high = int(pc.max(found.column(FENCE_COLUMN)).as_py())
            top = high if top is None else max(top, high)
    return top
