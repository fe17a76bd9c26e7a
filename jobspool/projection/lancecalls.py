"""The raw LanceDB calls of the projection store (`lance.py`), one function each.

They are the seams: `lance.py` calls them through its own module names, so a test can
monkeypatch `jobspool.projection.lance._create_table` (or any other) to inject a fault
at that exact call. `import lancedb` costs over a second, so it happens in `_connect`,
never when this module is imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import pyarrow as pa

from jobspool.projection import objectstore as obj
from jobspool.projection.handler import FENCE_COLUMN, VERSION_COLUMN, PendingWrite
from jobspool.projection.tableread import sql_name, sql_string

#: The fence, as LanceDB evaluates it inside the merge: the incoming (source)
#: row replaces the stored (target) one only when its (version, fence) pair is
#: greater or equal, compared lexicographically.
FENCE_WHERE = (
    "source.version > target.version OR (source.version = target.version AND source.fence >= target.fence)"
)



def _connect(uri: str, storage_options: Mapping[str, str] | None = None, *,
             follow: bool = True) -> Any:
    # A compaction that loses a commit race (two processes maintaining one table) is
    # reported by maintenance as `deferred`; LanceDB's own WARN line for it reached stderr
    # as a raw Rust log an operator took for a failure. Set before the import, which reads
    # it; an operator's own LANCEDB_LOG wins.
    os.environ.setdefault("LANCEDB_LOG", "warn,lance::dataset::optimize=error")
    import lancedb  # lazy: 1-2 s, paid only by processes that project

    # `follow`: each call sees the latest version (see the module docstring); otherwise a
    # table stays at the version it was opened at, and a commit from it conflicts with any
    # made since (`_add_columns`).
    return lancedb.connect(uri, read_consistency_interval=timedelta(0) if follow else None,
                           storage_options=obj.lance_options(storage_options))


def _open_table(conn: Any, name: str) -> Any | None:
    try:
        return conn.open_table(name)
    except ValueError as exc:
        if "not found" in str(exc).lower():
            return None
        raise


def _create_table(conn: Any, name: str, schema: pa.Schema) -> Any:
    # exist_ok: another process may create the same table at the same moment;
    # both then write into the one that won.
    return conn.create_table(name, schema=schema, exist_ok=True)


def _add_table_columns(tbl: Any, fields: Sequence[pa.Field]) -> None:
    # Nullable, so the rows (and tombstones) already there hold nulls in them.
    tbl.add_columns(pa.schema(list(fields)))


def _stored_fences(tbl: Any, key: str, writes: Sequence[PendingWrite]
                   ) -> dict[str, tuple[float, int]]:
    """The (version, fence) the table holds for the keys these writes upsert: on a table
    made by deletes alone, the tombstones an upsert must beat for its columns to count."""
    keys = sorted({r[key] for w in writes for r in w.rows if isinstance(r.get(key), str)})
    if not keys:
        return {}
    names = ", ".join(sql_string(k) for k in keys)
    found = tbl.search().where(f"{sql_name(key)} IN ({names})").select(
        [key, VERSION_COLUMN, FENCE_COLUMN]).limit(4 * len(keys) + 16).to_arrow().to_pylist()
    out: dict[str, tuple[float, int]] = {}
    for row in found:
        pair = (float(row[VERSION_COLUMN]), int(row[FENCE_COLUMN]))
        out[row[key]] = max(out.get(row[key], pair), pair)
    return out


def _execute_merge(tbl: Any, key: str, batch: pa.Table, timeout: timedelta | None) -> Any:
    builder = tbl.merge_insert(key).when_matched_update_all(where=FENCE_WHERE)
    if hasattr(builder, "use_index"):
        # Never lance's index-assisted merge, taken once the key has a BTREE (maintenance
        # builds one past `index_threshold`): lance 14 (lancedb 0.41) refuses it for a
        # conditional merge on a keyed table ("Primary key column ... must not be
        # nullable"), and earlier releases had it silently match no rows (lancedb#3515,
        # lance#7934) or leave inserted keys out of the commit's conflict check
        # (lance#9238): fencing must not stand on that path. The index still serves the
        # fence lookup before the merge (`_stored_fences`) and readers.
        builder = builder.use_index(False)
    return (
        builder
        .when_not_matched_insert_all()
        # "null": tombstones hold null vectors, which the default "error"
        # refuses. Bad user vectors never get here (schema.strict_array).
        .execute(batch, on_bad_vectors="null", timeout=timeout)
    )


