"""What a handler hands to the projection: pending, fenced writes (no LanceDB here).

A handler never opens LanceDB. It calls `ctx.upsert(table, rows, version=...)`
or `ctx.delete(table, ids, version=...)`; the worker turns each call into a
`PendingWrite` with `make_upsert` / `make_delete`, gathers the writes of every
job of a claimed batch, and hands them to `ProjectionStore.apply`, which
commits one merge per table (group commit).

Every write carries two numbers that decide, inside the merge, whether it may
replace what a row holds (DESIGN §4):

- `version`: the source's version of the record (an mtime, a revision). When
  the handler gives none, the lease token stands in for it.
- `fence`: the lease token of the job run that produced the write. Tokens are
  strictly increasing across all claims, so a zombie run (lease expired,
  job claimed again) always writes with a lower fence than its successor.

A write applies only when `(version, fence)` is >= the stored pair. This
protects against stale and duplicated runs and against a late write
resurrecting a deleted record (deletes are tombstones with the same pair).
It does not protect against a source that hands out a *higher* version for
older content: the version must really order the source's states.

This module imports neither LanceDB nor pyarrow, so the worker and the CLI can
build writes without paying for either.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jobspool.errors import InvalidType, ProjectionError

# Reserved columns every projected table carries besides the user's columns.
VERSION_COLUMN = "version"  # float64: the source version of the row
_EXACT_INT = 2**53  # float64 holds every integer up to this exactly
FENCE_COLUMN = "fence"  # int64: the lease token of the write that produced the row
# The largest fence a write may carry: int64 with room above it. A worker raises its
# spool's token counter above the largest fence a table holds (`sink.py`), so one near
# 2**63 handed every later job a token the column cannot hold: each write that followed
# failed with OverflowError until the jobs were dead-lettered.
MAX_FENCE = 2**62
DELETED_COLUMN = "_deleted"  # bool: True for a tombstone
WRITTEN_AT_COLUMN = "_written_at"  # float64: wall-clock seconds of the commit (tombstone GC)
RESERVED_COLUMNS: frozenset[str] = frozenset(
    {VERSION_COLUMN, FENCE_COLUMN, DELETED_COLUMN, WRITTEN_AT_COLUMN}
)
# Columns readers never see: they exist for fencing and garbage collection only.
HIDDEN_COLUMNS: tuple[str, ...] = (DELETED_COLUMN, WRITTEN_AT_COLUMN)

#: The filter that keeps live rows (drops tombstones). Add it to every raw
#: LanceDB query on a projected table: `tbl.search().where(LIVE_FILTER)`, or
#: `f"({your_filter}) AND {LIVE_FILTER}"`.
LIVE_FILTER = f"{DELETED_COLUMN} = false"

# LanceDB accepts letters, digits, `_`, `-` and `.` in table names; a leading
# dot is refused because the maintenance state file beside the tables is one.
TABLE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
MAX_KEY_CHARS = 1024

Op = Literal["upsert", "delete"]


def _one_line(exc: BaseException) -> str:
    # How the store and maintenance report a LanceDB error: one bounded line.
    # Here because this module loads neither LanceDB nor pyarrow.
    from jobspool.projection.faults import one_line

    return one_line(f"{type(exc).__name__}: {exc}")


# Quoted text in a LanceDB filter: 'string', "identifier", `identifier`. A doubled quote
# is the quote itself; a backslash escapes nothing (checked against lancedb 0.40).
_QUOTES = {"'": "string", '"': "quoted name", "`": "quoted name"}


def check_filter(where: object, *, argument: str = "where") -> str:
    """Return `where` when it is one self-contained filter expression, else raise.

    `live_filter` pastes it inside parentheses ahead of the tombstone condition, so it
    must not be able to close them: `where="true) OR (true"` returned deleted rows.
    Refused (one line naming `argument`): a parenthesis closed before it was opened or
    left open, an unterminated quote, a comment (`--` swallowed the tombstone condition,
    `/* */` hides parentheses from this count), and `$` outside quotes (dollar-quoted
    strings hide them too, and LanceDB panics on them). InvalidType when not a string.
    """
    if not isinstance(where, str):
        raise InvalidType(f"argument {argument!r} must be a filter string (SQL), got "
                          f"{type(where).__name__} {where!r:.80}", field=argument)
    depth = 0
    i, n = 0, len(where)
    while i < n:
        char = where[i]
        if char in _QUOTES:
            end = i + 1
            while True:
                end = where.find(char, end)
                if end < 0:
                    raise ProjectionError(f"argument {argument!r} has an unterminated "
                                          f"{_QUOTES[char]} (a {char} opened at offset {i}): "
                                          f"{where!r:.120}", field=argument)
                if where.startswith(char * 2, end):
                    end += 2  # a doubled quote stands for the quote, inside the text
                    continue
                break
            i = end + 1
            continue
        if where.startswith(("--", "/*"), i) or char == "$":
            what = "a comment" if char != "$" else "a '$' outside quotes"
            raise ProjectionError(f"argument {argument!r} holds {what} at offset {i}, which a "
                                  f"filter does not take: {where!r:.120}", field=argument)
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ProjectionError(f"argument {argument!r} closes a parenthesis it never "
                                      f"opened (offset {i}): {where!r:.120}", field=argument)
        i += 1
    if depth:
        raise ProjectionError(f"argument {argument!r} leaves {depth} parenthesis(es) open: "
                              f"{where!r:.120}", field=argument)
    return where


def live_filter(where: str | None = None) -> str:
    """Return a LanceDB filter that applies `where` to live rows only (tombstones excluded).

    `where` must be one self-contained expression (see `check_filter`): raises
    ProjectionError (one line) when it could reach past its parentheses.
    """
    if where is None or (isinstance(where, str) and not where.strip()):
        return LIVE_FILTER
    return f"({check_filter(where)}) AND {LIVE_FILTER}"


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """One projection write of one job run, not yet committed.

    `rows` is set for an upsert and empty for a delete; `keys` the other way
    round. `version` is already resolved (the lease token when the handler
    gave none) and `fence` is the lease token.
    """

    job_id: str
    table: str
    op: Op
    rows: tuple[dict[str, Any], ...]
    keys: tuple[str, ...]
    version: float
    fence: int


def _check_common(job_id: object, table: object, version: object, fence: object) -> float:
    if not isinstance(job_id, str) or not job_id:
        raise ProjectionError(f"field 'job_id' must be a non-empty string, got {job_id!r}")
    if not isinstance(table, str) or not TABLE_NAME_RE.fullmatch(table):
        raise ProjectionError(
            f"table name {table!r} must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}",
            table=str(table),
        )
    if isinstance(fence, bool) or not isinstance(fence, int) or not 0 <= fence <= MAX_FENCE:
        raise ProjectionError(
            f"field 'fence' must be an integer from 0 to 2**62 (the lease token), got "
            f"{fence!r}",
            table=table,
            field=FENCE_COLUMN,
        )
    if version is None:
        return float(fence)
    if isinstance(version, numbers.Integral) and not isinstance(version, bool):
        version = int(version)  # numpy's integers (a stat array's st_mtime_ns // 1000)
    elif isinstance(version, numbers.Real) and not isinstance(version, bool | float):
        version = float(version)  # numpy's float32 and the like (float64 is a float already)
    if isinstance(version, bool) or not isinstance(version, int | float):
        raise ProjectionError(
            f"field 'version' must be a number (an mtime, a revision), got {version!r}",
            table=table,
            field=VERSION_COLUMN,
        )
    if isinstance(version, int) and abs(version) > _EXACT_INT:
        # Stored as float64: past 2**53 neighbouring integers round to one value, and a
        # stale write could then tie and win on its fence. Refused rather than misordered.
        raise ProjectionError(
            f"field 'version' {version} is too large to order exactly (stored as a float64, "
            f"integers up to 2**53); use microseconds (st_mtime_ns // 1000) or a revision",
            table=table, field=VERSION_COLUMN)
    resolved = float(version)
    if not math.isfinite(resolved):
        raise ProjectionError(
            f"field 'version' must be finite, got {version!r}", table=table, field=VERSION_COLUMN
        )
    return resolved


def check_key(value: object, *, table: str, key: str) -> str:
    """Return `value` when it is a usable row key, else raise ProjectionError naming `key`."""
    if not isinstance(value, str):
        raise ProjectionError(
            f"key field {key!r} of table {table!r} must be a string, got "
            f"{type(value).__name__} {value!r:.80}",
            table=table,
            field=key,
        )
    if not value or len(value) > MAX_KEY_CHARS or "\x00" in value or not _utf8(value):
        raise ProjectionError(
            f"key field {key!r} of table {table!r} must be 1-{MAX_KEY_CHARS} characters "
            f"without NUL or lone surrogates, got {value!r:.80}",
            table=table,
            field=key,
        )
    return value


def _utf8(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (no lone surrogate): a key or column name that
    cannot failed the merge of every job in the batch, not the one job that wrote it."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_row(row: object, *, table: str, key: str) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise ProjectionError(
            f"rows for table {table!r} must be dicts, got {type(row).__name__}", table=table
        )
    if key not in row:
        raise ProjectionError(
            f"row for table {table!r} is missing its key field {key!r}", table=table, field=key
        )
    check_key(row[key], table=table, key=key)
    for name in row:
        if not isinstance(name, str) or not name:
            raise ProjectionError(
                f"field names of table {table!r} must be non-empty strings, got {name!r}",
                table=table,
                field=str(name),
            )
        if name in RESERVED_COLUMNS:
            raise ProjectionError(
                f"field {name!r} of table {table!r} is reserved for fencing; rename it",
                table=table,
                field=name,
            )
        bad = lance_refuses(name)
        if bad:
            # Found at the merge instead, it failed every job of the batch writing this
            # table (a backtick even made the table refuse every later merge).
            raise ProjectionError(
                f"field {name!r} of table {table!r} {bad}; rename it", table=table, field=name
            )
    # The row as it is now: the handler may reuse or mutate its dict, or a list or array in
    # it (an embedding buffer refilled in a loop wrote the last vector into every row).
    return {name: _snapshot(value) for name, value in row.items()}


# Column names LanceDB keeps for itself (lance's reserved row metadata).
LANCE_RESERVED = frozenset({"_rowid", "_rowaddr", "_rowoffset", "_row_created_at_version",
                            "_row_last_updated_at_version"})


def lance_refuses(name: str) -> str | None:
    """Why LanceDB would refuse `name` as a column (None when it takes it)."""
    if name in LANCE_RESERVED:
        return "is reserved by LanceDB"
    for char, what in ((".", "a dot"), ("`", "a backtick"), ("\x00", "a NUL character")):
        if char in name:
            return f"holds {what}, which LanceDB refuses in a column name"
    if not _utf8(name):
        return "holds a lone surrogate, which cannot be written as UTF-8"
    return None


def _snapshot(value: Any) -> Any:
    """A copy of the containers in a row's value (lists, tuples, dicts, arrays); scalars as
    they are."""
    if isinstance(value, list | tuple):
        return [_snapshot(v) for v in value]
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    copy = getattr(value, "copy", None)
    if copy is not None and hasattr(value, "__array__"):  # numpy arrays and the like
        return copy()
    return value


def make_upsert(
    job_id: str,
    table: str,
    rows: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    version: float | None,
    fence: int,
    key: str = "id",
) -> PendingWrite:
    """Validate the shape of an upsert cheaply and return it as a PendingWrite.

    Checks: every row is a dict holding a string `key`, no field is reserved
    (`version`, `fence`, `_deleted`, `_written_at`), `version` is a finite
    number or None (then the lease token `fence` stands in). Whether the
    fields fit the table's schema is checked later, by the store, per job.
    Raises ProjectionError (one line, naming the field) on the first problem.
    """
    resolved = _check_common(job_id, table, version, fence)
    checked: tuple[dict[str, Any], ...]
    if isinstance(rows, Mapping):
        checked = (_check_row(rows, table=table, key=key),)
    elif isinstance(rows, str | bytes) or not isinstance(rows, Iterable):
        raise ProjectionError(
            f"rows for table {table!r} must be a dict or an iterable of dicts, got {type(rows).__name__}",
            table=table,
        )
    else:
        checked = tuple(_check_row(row, table=table, key=key) for row in rows)
    return PendingWrite(job_id, table, "upsert", checked, (), resolved, fence)


def make_delete(
    job_id: str,
    table: str,
    ids: str | Iterable[str],
    version: float | None,
    fence: int,
    *,
    key: str = "id",
) -> PendingWrite:
    """Validate a delete and return it as a PendingWrite (tombstones, applied by the store).

    `ids` is one key or an iterable of keys; each must be a non-empty string.
    Raises ProjectionError naming the bad id and the table's `key` column.
    """
    resolved = _check_common(job_id, table, version, fence)
    if isinstance(ids, str):
        keys: tuple[str, ...] = (check_key(ids, table=table, key=key),)
    elif isinstance(ids, bytes) or not isinstance(ids, Iterable):
        raise ProjectionError(
            f"ids for table {table!r} must be a string or an iterable of strings, got {type(ids).__name__}",
            table=table,
        )
    else:
        keys = tuple(check_key(i, table=table, key=key) for i in ids)
    return PendingWrite(job_id, table, "delete", (), keys, resolved, fence)


__all__ = [
    "DELETED_COLUMN",
    "FENCE_COLUMN",
    "HIDDEN_COLUMNS",
    "LIVE_FILTER",
    "RESERVED_COLUMNS",
    "VERSION_COLUMN",
    "WRITTEN_AT_COLUMN",
    "PendingWrite",
    "check_filter",
    "check_key",
    "live_filter",
    "make_delete",
    "make_upsert",
]
