"""Deciding what one group commit writes: per-job checks, per-key dedup, one batch per table.

`ProjectionStore.apply` (in `lance.py`) decides here and persists there:
nothing in this module opens, creates or merges into a LanceDB table. The
store hands in the schema it found (stored, declared, or None for a table
that does not exist yet) and gets back a `TablePlan` to merge, or the jobs
whose rows do not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from jobspool.errors import ProjectionError
from jobspool.projection.handler import RESERVED_COLUMNS, PendingWrite, check_key
from jobspool.projection.schema import (
    Entry,
    build_batch,
    columns_pending,
    foreign_table_problem,
    infer_schema,
    key_only_schema,
    primary_key_of,
    required_columns,
    table_schema,
    unset_vector,
    user_columns,
)


@dataclass(frozen=True)
class ApplyResult:
    """What one `ProjectionStore.apply` did.

    - `failed`: job id -> error, for jobs that wrote a table whose commit
      failed. The outcome is unknown (the commit may have landed); retry the
      job, the fenced merge makes the re-run idempotent.
    - `rejected`: job id -> permanent error: its rows do not fit (missing or
      non-string key, a field not in the schema or of the wrong type). None
      of its writes were applied, in any table; the other jobs' were.
    - `tables`: table -> rows the fence let through in that table's one merge.
    """

    failed: dict[str, BaseException]
    rejected: dict[str, ProjectionError]
    tables: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.rejected


@dataclass
class TablePlan:
    """One table's share of a group commit: the batch to merge (None: nothing to write)."""

    table: str
    schema: pa.Schema
    exists: bool
    job_ids: set[str]
    batch: pa.Table | None
    # Columns the first rows bring to a table made by deletes alone, added before the merge.
    add_fields: tuple[pa.Field, ...] = ()


#: What the store plans for one table: a plan, or the jobs rejected (job id -> error).
Planner = Callable[[str, list[PendingWrite]], tuple[TablePlan | None, dict[str, ProjectionError]]]


def decide(
    by_table: Mapping[str, list[PendingWrite]], plan: Planner, forget: Callable[[str], None]
) -> tuple[dict[str, TablePlan], dict[str, ProjectionError], dict[str, BaseException]]:
    """Plan every table: returns (plans, rejected jobs, failed jobs).

    Repeats until no job is newly rejected: dropping a job can change which
    row wins a key, and a job rejected in one table is dropped from every
    table (it will be dead-lettered whole). A table whose planning raises
    (opening it failed: outcome unknown) fails its jobs and is `forget`-ten.
    """
    failed: dict[str, BaseException] = {}
    rejected: dict[str, ProjectionError] = {}
    plans: dict[str, TablePlan] = {}
    broken: set[str] = set()
    while True:
        plans.clear()
        newly = False
        for name, tws in by_table.items():
            live = [w for w in tws if w.job_id not in rejected]
            if not live or name in broken:
                continue
            try:
                planned, bad = plan(name, live)
            except Exception as exc:  # opening the table failed: outcome unknown
                forget(name)
                broken.add(name)
                for w in live:
                    failed.setdefault(w.job_id, exc)
                continue
            if bad:
                rejected.update(bad)
                newly = True
            elif planned is not None:
                plans[name] = planned
        if not newly:
            return plans, rejected, failed


def plan_table(
    name: str,
    writes: list[PendingWrite],
    *,
    key: str,
    schema: pa.Schema | None,
    exists: bool,
    written_at: float,
    declared: pa.Schema | None = None,
    stored: Mapping[str, tuple[float, int]] | None = None,
) -> tuple[TablePlan | None, dict[str, ProjectionError]]:
    """Check `writes` against the table's schema, dedup per key and build the batch.

    `schema` is the stored or declared one; None for a new table without a
    declared schema, which then gets one inferred from these rows (or, for deletes
    alone, the key and reserved columns: `key_only_schema`). A table made that way gets
    its other columns with the first rows written to it (`TablePlan.add_fields`): those
    of `declared` (the store's declared schema) when there is one, else inferred from the
    rows that beat what the table holds for their key (`stored`: (version, fence) per key):
    a stale row is fenced out, and neither its columns nor their types may count.
    """
    made_with = primary_key_of(schema) if exists and schema is not None else None
    if made_with is not None and made_with != key:
        # Not a broken table: a writer not told its key (the README asks for the same
        # `keys=` everywhere). "Drop it" or "make the column nullable" would lose data.
        mismatch = ProjectionError(
            f"table {name!r} is keyed on {made_with!r}, not {key!r}: give this worker "
            f"keys={{{name!r}: {made_with!r}}} (App/Worker keys=), as the writer that made it",
            table=name)
        return None, {w.job_id: mismatch for w in writes}
    problem = foreign_table_problem(schema, key) if exists and schema is not None else None
    if problem is not None:
        # No retry can fix it: every job writing it is dead-lettered, saying why (it
        # retried with LanceDB's own error until its attempts ran out).
        refusal = ProjectionError(f"table {name!r} cannot take fenced writes: {problem}; "
                                  "project into another table, or drop this one to have it "
                                  "recreated", table=name)
        return None, {w.job_id: refusal for w in writes}
    add_fields: tuple[pa.Field, ...] = ()
    if schema is None:
        rows = _keyed_rows(writes, key)
        if rows:
            schema = table_schema(infer_schema(rows, key), key)
        elif any(w.op == "delete" for w in writes):
            # Deletes before any row: the table is made to hold their tombstones, or an
            # older upsert of a deleted key arriving later would create the row.
            schema = key_only_schema(key)
    elif exists and columns_pending(schema, key):
        if stored:
            # Rows the merge's fence would drop go now: they would land nothing, and their
            # columns (an older producer's shape) would refuse every later fresh row.
            writes = [_without_stale(w, key, stored) for w in writes]
        # This store's declared schema, else the one these rows would give a new table.
        wanted = declared
        if wanted is None and (rows := _keyed_rows(writes, key)):
            wanted = table_schema(infer_schema(rows, key), key)
        if wanted is not None:
            add_fields = tuple(f for f in wanted if f.name not in schema.names)
            schema = pa.schema([*schema, *add_fields], metadata=schema.metadata)
    bad: dict[str, ProjectionError] = {}
    allowed = user_columns(schema) if schema is not None else frozenset({key})
    required = required_columns(schema) if schema is not None else frozenset()
    for w in writes:
        err = check_write(w, allowed, key, required, new=None if exists else
                          "declared" if declared is not None else "inferred")
        if err is not None:
            bad.setdefault(w.job_id, _declared_too_late(err, declared, schema, name))
    if bad:
        return None, bad
    job_ids = {w.job_id for w in writes}
    if schema is None:
        return TablePlan(name, pa.schema([]), False, job_ids, None), {}
    built = build_batch(name, schema, key, dedup(writes, key), written_at)
    if built.bad:
        return None, built.bad
    return TablePlan(name, schema, exists, job_ids, built.batch, add_fields), {}


def _declared_too_late(err: ProjectionError, declared: pa.Schema | None,
                       schema: pa.Schema | None, name: str) -> ProjectionError:
    """A row refused for a column this store declares but the table, made before the
    declaration, lacks: say so and how to add it (a declaration applies when a table is
    made; "not in the schema" while `schemas=` named it read as a bug)."""
    field = getattr(err, "field", None)
    if declared is None or schema is None or field not in declared.names \
            or field in schema.names:
        return err
    kind = declared.field(field).type
    return ProjectionError(
        f"field {field!r} is declared in schemas= but table {name!r} was made before it "
        f"(a declaration applies when a table is made): add the column to the table once, "
        f"e.g. lancedb.connect(URI).open_table({name!r}).add_columns(pyarrow.schema("
        f"[pyarrow.field({field!r}, pyarrow.{kind})]))", table=name, field=field)


def _without_stale(w: PendingWrite, key: str, stored: Mapping[str, tuple[float, int]]
                   ) -> PendingWrite:
    if w.op != "upsert":
        return w
    floor = (float("-inf"), -1)
    kept = tuple(r for r in w.rows if not isinstance(r.get(key), str)
                 or (w.version, w.fence) >= stored.get(r[key], floor))
    return w if len(kept) == len(w.rows) else replace(w, rows=kept)


def _keyed_rows(writes: list[PendingWrite], key: str) -> list[dict[str, Any]]:
    """The upserted rows whose key is a string: what a table's columns are inferred from."""
    return [r for w in writes for r in w.rows if isinstance(r.get(key), str)]


def check_write(w: PendingWrite, allowed: frozenset[str], key: str,
                required: frozenset[str] = frozenset(), *, new: str | None = None
                ) -> ProjectionError | None:
    """The reason one job's write does not fit the table (None when it does). `new`: the
    table is made by this write, its columns "inferred" from it or "declared" (schemas=)."""
    try:
        if w.op == "delete":
            for k in w.keys:
                check_key(k, table=w.table, key=key)
            return None
        for row in w.rows:
            if key not in row:
                return ProjectionError(
                    f"row for table {w.table!r} is missing its key field {key!r}",
                    table=w.table,
                    field=key,
                )
            check_key(row[key], table=w.table, key=key)
            for field in sorted(required):
                if row.get(field) is None:
                    return ProjectionError(
                        f"field {field!r} of table {w.table!r} is declared not null; "
                        f"the row for {row[key]!r:.60} has none", table=w.table, field=field)
            for field, value in row.items():
                if field in RESERVED_COLUMNS:
                    return ProjectionError(
                        f"field {field!r} of table {w.table!r} is reserved for fencing",
                        table=w.table,
                        field=field,
                    )
                if field not in allowed and not unset_vector(field, value):
                    # A new table's columns come from its first write or its declaration:
                    # a field left out of them was not "not in the schema" of a table that
                    # did not exist.
                    if new == "declared":
                        where = (f"is not among the columns declared for table {w.table!r} "
                                 "(schemas=)")
                    elif new:
                        where = (f"was left out of the columns of the new table "
                                 f"{w.table!r}, inferred from its first write")
                    else:
                        where = f"is not in the schema of table {w.table!r}"
                    return ProjectionError(
                        f"field {field!r} {where} "
                        f"(columns: {', '.join(sorted(allowed))}){_unstorable(value)}",
                        table=w.table,
                        field=field,
                    )
    except ProjectionError as exc:
        return exc
    return None


def _unstorable(value: Any) -> str:
    """Why Arrow cannot store `value`, when it cannot: a table's first write leaves such a
    column out of the schema it infers, and "not in the schema" alone blamed the schema
    for a value (an int past 64 bits, an object, a dict with int keys)."""
    try:
        typ = pa.array([value]).type
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        why = " ".join(str(exc).split())[:160]
        return f"; its value {value!r:.60} cannot be stored: {why}"
    if _has_empty_struct(typ):
        return (f"; its value {value!r:.60} holds an empty object, which says nothing of "
                "the fields a column of it would have (write null, or declare the table's "
                "schema)")
    return ""


def _has_empty_struct(typ: pa.DataType) -> bool:
    if pa.types.is_struct(typ):
        return typ.num_fields == 0 or any(_has_empty_struct(typ.field(i).type)
                                          for i in range(typ.num_fields))
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return _has_empty_struct(typ.value_type)
    return False


def dedup(writes: Iterable[PendingWrite], key: str) -> list[Entry]:
    """Keep, per key, the write with the highest (version, fence); on a tie the later one."""
    best: dict[str, Entry] = {}
    for w in writes:
        if w.op == "upsert":
            candidates: Iterable[Entry] = (
                Entry(w.job_id, row[key], row, w.version, w.fence) for row in w.rows
            )
        else:
            candidates = (Entry(w.job_id, k, None, w.version, w.fence) for k in w.keys)
        for e in candidates:
            cur = best.get(e.key)
            if cur is None or (e.version, e.fence) >= (cur.version, cur.fence):
                best[e.key] = e
    return list(best.values())


__all__ = ["ApplyResult", "Planner", "TablePlan", "check_write", "decide", "dedup", "plan_table"]
