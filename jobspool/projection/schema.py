"""Arrow schemas and batches of projected tables: inference, strict conversion, tombstones.

Deciding what a batch holds lives here; committing it lives in `lance.py`.
Only pyarrow is needed (no LanceDB), so this module is cheap to import and to
test on its own.

Conversion is strict on purpose: pyarrow would happily turn `1.5` into the
integer `1` or the string `"12"` into the number `12`. A value lands in a
column only when its inferred Arrow type is of the same family as the
column's (numbers into numbers without loss, strings into strings, lists
into lists, ...), so a row that does not fit fails its own job with an error
naming the field instead of being silently altered.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from jobspool.errors import ProjectionError
from jobspool.projection.handler import (
    DELETED_COLUMN,
    FENCE_COLUMN,
    RESERVED_COLUMNS,
    VERSION_COLUMN,
    WRITTEN_AT_COLUMN,
    lance_refuses,
)

# Field metadata that makes a column LanceDB's unenforced primary key. Set at
# creation, so the key exists from the table's first version: there is no
# window in which a concurrent writer could insert a duplicate new key.
# (`Table.set_unenforced_primary_key` writes the same metadata, as a second
# commit, and refuses to run twice.)
PK_METADATA_KEY = b"lance-schema:unenforced-primary-key:position"
# A user column declared NOT NULL: stored nullable (a tombstone holds nulls there), so
# the declaration is kept in the field's metadata and checked on every live row.
REQUIRED_METADATA_KEY = b"jobspool:required"
# On a table made by deletes alone (no row yet to give it columns): its columns come with
# the first rows written, once (`columns_pending`).
PENDING_METADATA_KEY = b"jobspool:columns-pending"
KEY_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

RESERVED_FIELDS: tuple[pa.Field, ...] = (
    pa.field(VERSION_COLUMN, pa.float64(), nullable=False),
    pa.field(FENCE_COLUMN, pa.int64(), nullable=False),
    pa.field(DELETED_COLUMN, pa.bool_(), nullable=False),
    pa.field(WRITTEN_AT_COLUMN, pa.float64(), nullable=False),
)
_ARROW_ERRORS = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    OverflowError,
    TypeError,
    ValueError,
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One row of a merge batch after deduplication: an upsert's row or a tombstone."""

    job_id: str
    key: str
    row: dict[str, Any] | None  # None for a tombstone
    version: float
    fence: int


def check_key_name(key: str) -> str:
    """Return `key` when it can name the key column, else raise ValueError."""
    if not isinstance(key, str) or not KEY_NAME_RE.fullmatch(key) or key in RESERVED_COLUMNS:
        raise ValueError(
            f"key column {key!r} must match [A-Za-z_][A-Za-z0-9_]{{0,63}} and not be a reserved column"
        )
    return key


def user_columns(schema: pa.Schema) -> frozenset[str]:
    """Return the names of the user's columns of a projected table (reserved ones excluded)."""
    return frozenset(n for n in schema.names if n not in RESERVED_COLUMNS)


def required_columns(schema: pa.Schema) -> frozenset[str]:
    """The user columns declared NOT NULL (`table_schema` records them)."""
    return frozenset(f.name for f in schema
                     if f.metadata and f.metadata.get(REQUIRED_METADATA_KEY))


def primary_key_of(schema: pa.Schema) -> str | None:
    """The column a projected table was made with as its key (its primary-key metadata)."""
    for f in schema:
        if f.metadata and f.metadata.get(PK_METADATA_KEY):
            return str(f.name)
    return None


def foreign_table_problem(schema: pa.Schema, key: str) -> str | None:
    """Why an existing table cannot take fenced writes (None when it can): made by hand
    or by another tool, it lacks the fencing columns or keys on a non-string column."""
    for f in RESERVED_FIELDS:
        if f.name not in schema.names:
            return f"it has no {f.name!r} column (not a jobspool projection table)"
        if schema.field(f.name).type != f.type:
            return f"its {f.name!r} column is {schema.field(f.name).type}, not {f.type}"
    if key not in schema.names:
        return f"it has no key column {key!r}"
    typ = schema.field(key).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        return f"its key column {key!r} is {typ}, not a string"
    reserved = {f.name for f in RESERVED_FIELDS}
    strict = [f.name for f in schema if not f.nullable and f.name != key
              and f.name not in reserved]
    if strict:
        # A column added NOT NULL by hand (`add_columns` with a default): a tombstone, or a
        # row without it, is refused by LanceDB at the merge — retried, then dead-lettered
        # with Arrow's message, every job writing the table.
        return (f"its column {strict[0]!r} is NOT NULL (a tombstone holds nulls there); "
                "make it nullable or drop it")
    return None


def table_schema(user: pa.Schema, key: str) -> pa.Schema:
    """Return the stored schema for a user's schema.

    The key column becomes a non-nullable string carrying the primary-key
    metadata; every other user column becomes nullable (a tombstone holds
    nulls there), one declared NOT NULL keeping that in its metadata (live rows
    without it are refused: see `required_columns`); the reserved columns are
    appended. Raises ValueError when
    the key is missing or not a string, or a reserved column has another type.
    """
    if key not in user.names:
        raise ValueError(f"schema has no key column {key!r}")
    fields: list[pa.Field] = []
    reserved = {f.name: f for f in RESERVED_FIELDS}
    for f in user:
        bad = lance_refuses(f.name)
        if bad is not None:
            # Declared, it was taken, and every write to the table then failed (retried to
            # a dead letter) at the merge with LanceDB's schema error.
            raise ValueError(f"column {f.name!r} {bad}")
        if f.name in reserved:
            if f.type != reserved[f.name].type:
                raise ValueError(f"column {f.name!r} is reserved and must be {reserved[f.name].type}")
            continue
        if f.name == key:
            if not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
                raise ValueError(f"key column {key!r} must be a string column, not {f.type}")
            meta = dict(f.metadata or {})
            meta[PK_METADATA_KEY] = b"1"
            fields.insert(0, pa.field(key, f.type, nullable=False, metadata=meta))
        elif not f.nullable:
            meta = dict(f.metadata or {})
            meta[REQUIRED_METADATA_KEY] = b"1"
            fields.append(f.with_nullable(True).with_metadata(meta))
        else:
            fields.append(f.with_nullable(True))
    fields.extend(RESERVED_FIELDS)
    return pa.schema(fields)


def key_only_schema(key: str) -> pa.Schema:
    """The schema of a table whose first writes were deletes: the key and the reserved
    columns, enough to hold tombstones, marked so the first rows add their columns."""
    stored = table_schema(pa.schema([pa.field(key, pa.string(), nullable=False)]), key)
    return stored.with_metadata({**(stored.metadata or {}), PENDING_METADATA_KEY: b"1"})


def columns_pending(schema: pa.Schema, key: str) -> bool:
    """Whether a stored table was made by deletes alone and has no user column but its key
    yet: the first rows written to it add theirs (`key_only_schema`)."""
    return (bool(schema.metadata) and PENDING_METADATA_KEY in schema.metadata
            and user_columns(schema) == frozenset({key}))


def _suggests_vector(name: str) -> bool:
    # The same rule LanceDB applies when it creates a table from data.
    lowered = name.lower()
    return "vector" in lowered or "embedding" in lowered


def unset_vector(name: str, value: Any) -> bool:
    """Whether `value` leaves a vector column unset, as None does: empty (`[]`, a numpy
    array of length 0). Such a column, unset in every row of a table's first write, is
    left out of its schema (`infer_schema`), and its empty values with it."""
    if value is None:
        return True
    if not _suggests_vector(name):
        return False
    if isinstance(value, list | tuple):
        return len(value) == 0
    return getattr(value, "ndim", None) == 1 and getattr(value, "size", None) == 0


def infer_schema(rows: Sequence[dict[str, Any]], key: str) -> pa.Schema:
    """Infer a user schema from the first rows written to a new table.

    Columns appear in first-seen order, the key first. A column whose values
    are all null becomes a nullable string column: text is what such a column
    most often holds (a title, a note not yet written), and a later value of
    another type is refused naming the field. Left out, every later value for
    it was refused as not in the schema. A column holding only empty lists
    becomes a list of strings, for the same reason, and so does any null deeper
    inside a value (`[[]]`, `{"a": None}`); a column of empty objects (`{}`) is left
    out, as nothing says what fields it has. A `vector`/`embedding`
    column is left out for good while all null or empty (its length is
    unknown; columns are not added later, except to a table made by deletes alone:
    `columns_pending`). A column
    with mixed types takes the type of its first value; rows that disagree
    then fail their own job. Lists of numbers in a column whose name contains
    `vector` or `embedding` become fixed-size float32 lists of the most common
    length, as LanceDB does, so vector search works. A `Decimal` column takes the
    scale of its first values and the widest precision (38 digits).
    """
    names: dict[str, None] = {key: None}
    for row in rows:
        for name in row:
            names.setdefault(name, None)
    fields: list[pa.Field] = [pa.field(key, pa.string(), nullable=False)]
    for name in names:
        if name == key or name in RESERVED_COLUMNS:
            continue
        values = [row[name] for row in rows if not unset_vector(name, row.get(name))]
        if not values:
            if not _suggests_vector(name):
                fields.append(pa.field(name, pa.string(), nullable=True))
            continue
        try:
            typ = pa.array(values).type
        except _ARROW_ERRORS:
            found = _first_type(values)
            if found is None:
                continue
            typ = found
        if pa.types.is_null(typ):
            continue
        if pa.types.is_list(typ) and pa.types.is_null(typ.value_type):
            # Only empty lists so far: list<null> would refuse every later item. Text, as
            # for an all-null column; a vector's length is unknown, so it is left out.
            if _suggests_vector(name):
                continue
            typ = pa.list_(pa.string())
        settled = _without_nulls(typ)
        if settled is None:
            continue
        typ = settled
        if (
            _suggests_vector(name)
            and pa.types.is_list(typ)
            and (pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type))
        ):
            lengths: dict[int, int] = {}
            for v in values:
                # Python sequences and 1-d arrays (numpy's): LanceDB's search needs the
                # fixed-size float32 list whichever the rows were built from.
                if isinstance(v, list | tuple) or getattr(v, "ndim", None) == 1:
                    lengths[len(v)] = lengths.get(len(v), 0) + 1
            if lengths:
                dim = max(lengths, key=lambda n: lengths[n])
                typ = pa.list_(pa.float32(), dim)
        if pa.types.is_decimal128(typ):
            # Arrow takes the first values' precision: Decimal("1.10") made decimal128(3, 2),
            # refusing 10.50 for good. The widest precision, their scale.
            typ = pa.decimal128(38, typ.scale)
        fields.append(pa.field(name, typ, nullable=True))
    return pa.schema(fields)


def _without_nulls(typ: pa.DataType) -> pa.DataType | None:
    """`typ` with every null inside it text, as for a column all null; None when it holds
    an empty object (`{}`: a struct of no fields), whose fields nothing tells. Either way a
    first write of `[[]]` or `{"meta": {}}` fixed a type no later value fitted."""
    if pa.types.is_null(typ):
        return pa.string()
    if pa.types.is_struct(typ):
        if typ.num_fields == 0:
            return None
        fields = []
        for f in (typ.field(i) for i in range(typ.num_fields)):
            inner = _without_nulls(f.type)
            if inner is None:
                return None
            fields.append(f.with_type(inner))
        return pa.struct(fields)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        inner = _without_nulls(typ.value_type)
        if inner is None:
            return None
        return pa.list_(inner) if pa.types.is_list(typ) else pa.large_list(inner)
    return typ


def _first_type(values: Sequence[Any]) -> pa.DataType | None:
    """The type of the first value Arrow can store alone: one job's value that nothing can
    store (a complex number, an integer past 64 bits) dropped the column from a new table,
    and every other job of the batch writing it was dead-lettered with it."""
    for value in values:
        try:
            return pa.array([value]).type
        except _ARROW_ERRORS:
            continue
    return None


def _family_fits(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether values inferred as `src` may be stored in a `dst` column (without reinterpretation)."""
    if src == dst or pa.types.is_null(src):
        return True
    t = pa.types
    if t.is_string(dst) or t.is_large_string(dst):
        return bool(t.is_string(src) or t.is_large_string(src))
    if t.is_binary(dst) or t.is_large_binary(dst) or t.is_fixed_size_binary(dst):
        return bool(t.is_binary(src) or t.is_large_binary(src) or t.is_fixed_size_binary(src))
    if t.is_boolean(dst):
        return bool(t.is_boolean(src))
    if t.is_integer(dst) or t.is_floating(dst) or t.is_decimal(dst):
        return bool(t.is_integer(src) or t.is_floating(src) or t.is_decimal(src))
    if t.is_temporal(dst):
        if t.is_timestamp(dst) and t.is_timestamp(src) and (src.tz is None) != (dst.tz is None):
            # A naive time cast into an aware column is taken as UTC (12:00 reads back as
            # 17:00+05:00), an aware one into a naive column loses its zone: refused.
            return False
        return bool(t.is_temporal(src))
    if t.is_list(dst) or t.is_large_list(dst) or t.is_fixed_size_list(dst):
        return (t.is_list(src) or t.is_large_list(src) or t.is_fixed_size_list(src)) and _family_fits(
            src.value_type, dst.value_type
        )
    if t.is_struct(dst):
        if not t.is_struct(src):
            return False
        dst_fields = {dst.field(i).name: dst.field(i).type for i in range(dst.num_fields)}
        for i in range(src.num_fields):
            sub = src.field(i)
            if sub.name not in dst_fields or not _family_fits(sub.type, dst_fields[sub.name]):
                return False
        return True
    return True  # other types: let pyarrow's safe cast decide


def strict_array(values: list[Any], field: pa.Field) -> pa.Array:
    """Convert Python values to an array of `field`'s type, refusing lossy or cross-family casts.

    Raises ValueError (or an Arrow error) describing the mismatch.
    """
    arr = pa.array(values)
    if arr.type != field.type:
        if not _family_fits(arr.type, field.type):
            raise ValueError(f"expected {field.type}, got {arr.type}")
        arr = arr.cast(field.type)  # safe=True: no truncation, no overflow
    if pa.types.is_fixed_size_list(field.type) and pa.types.is_floating(field.type.value_type):
        # LanceDB would drop or null a vector holding NaN; refuse it instead. A hole (None)
        # or an infinity was stored and ranked as if it were a number (a None as 0).
        flat = arr.flatten()
        if flat.null_count:
            raise ValueError("vector contains None")
        if pc.any(pc.is_nan(flat)).as_py():
            raise ValueError("vector contains NaN")
        if len(flat) and not pc.all(pc.is_finite(flat)).as_py():
            raise ValueError("vector contains an infinity")
    return arr


def field_error(table: str, field: pa.Field, value: Any, exc: BaseException) -> ProjectionError:
    """Return the permanent error for a value that does not fit its column."""
    detail = " ".join(str(exc).split())[:200]
    return ProjectionError(
        f"field {field.name!r} of table {table!r} does not fit its type {field.type}: "
        f"{type(value).__name__} {value!r:.60} ({detail})",
        table=table,
        field=field.name,
    )


@dataclass(frozen=True, slots=True)
class BuildResult:
    """A merge batch, or the jobs whose values do not fit (then build again without them)."""

    batch: pa.Table | None
    bad: dict[str, ProjectionError]


def build_batch(
    table: str, schema: pa.Schema, key: str, entries: Sequence[Entry], written_at: float
) -> BuildResult:
    """Build the merge batch for deduplicated entries, as a `pa.Table` of exactly `schema`.

    When a column does not convert as a whole, its values are converted one
    entry at a time to find the jobs at fault; those are returned in `bad`
    (and the caller builds again without them, since removing a job can
    change which row wins a key).
    """
    n = len(entries)
    arrays: list[pa.Array] = []
    bad: dict[str, ProjectionError] = {}
    for field in schema:
        name = field.name
        if name == key:
            arrays.append(pa.array([e.key for e in entries], type=field.type))
        elif name == VERSION_COLUMN:
            arrays.append(pa.array([e.version for e in entries], type=pa.float64()))
        elif name == FENCE_COLUMN:
            arrays.append(pa.array([e.fence for e in entries], type=pa.int64()))
        elif name == DELETED_COLUMN:
            arrays.append(pa.array([e.row is None for e in entries], type=pa.bool_()))
        elif name == WRITTEN_AT_COLUMN:
            arrays.append(pa.array([written_at] * n, type=pa.float64()))
        else:
            values = [None if e.row is None else e.row.get(name) for e in entries]
            try:
                arrays.append(strict_array(values, field))
            except _ARROW_ERRORS:
                pieces: list[pa.Array] = []
                for e, v in zip(entries, values, strict=True):
                    try:
                        pieces.append(strict_array([v], field))
                    except _ARROW_ERRORS as exc:
                        bad.setdefault(e.job_id, field_error(table, field, v, exc))
                if not bad:
                    # Each value fits alone, only their mix confused inference.
                    arrays.append(pa.concat_arrays(pieces) if pieces else pa.array([], type=field.type))
    if bad:
        return BuildResult(None, bad)
    return BuildResult(pa.Table.from_arrays(arrays, schema=schema), {})


__all__ = [
    "PK_METADATA_KEY",
    "RESERVED_FIELDS",
    "BuildResult",
    "Entry",
    "build_batch",
    "check_key_name",
    "columns_pending",
    "foreign_table_problem",
    "infer_schema",
    "key_only_schema",
    "primary_key_of",
    "strict_array",
    "table_schema",
    "user_columns",
]
