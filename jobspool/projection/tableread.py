"""Reading a projected table: live rows only, never tombstones, and LanceDB's refusals
of a read as one-line errors naming the table.

`LiveReads` is the read half of `LanceProjection` (lance.py), which supplies the
table handle (`raw`) and the empty result of a table not yet written (`_empty`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from jobspool.errors import InvalidType, ProjectionError
from jobspool.projection.faults import plain
from jobspool.projection.handler import (
    FENCE_COLUMN,
    HIDDEN_COLUMNS,
    LIVE_FILTER,
    VERSION_COLUMN,
    live_filter,
)


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def sql_name(column: str) -> str:
    """A column name as a LanceDB filter takes it whatever it is: bare, a key named `null`
    matched nothing (`get` said no row), `true` failed every upsert with a planner error,
    and `Path` was read as `path`. Key names hold no backtick (`keying.py`)."""
    return "`" + column + "`"


def strip_hidden(tbl: pa.Table) -> pa.Table:
    hidden = [c for c in HIDDEN_COLUMNS if c in tbl.column_names]
    return _user_columns_first(tbl.drop_columns(hidden) if hidden else tbl)


def _user_columns_first(tbl: pa.Table) -> pa.Table:
    """The user's columns ahead of `version` and `fence`, as in a table made from rows: a
    table made by deletes alone got its user columns after them (`add_columns` appends)."""
    names = tbl.column_names
    if FENCE_COLUMN not in names or VERSION_COLUMN not in names:
        return tbl
    after = names[names.index(FENCE_COLUMN) + 1:]
    late = [c for c in after if not c.startswith("_")]
    if not late:
        return tbl
    rest = [c for c in names if c not in late]
    at = rest.index(VERSION_COLUMN)
    return tbl.select([*rest[:at], *late, *rest[at:]])


class LiveReads:
    """Reads of one projected table that filter tombstones out before any limit."""

    name: str
    key: str

    @property
    def raw(self) -> Any | None:
        """The LanceDB table, or None until first written (`LanceProjection.raw`)."""
        raise NotImplementedError

    def _empty(self) -> pa.Table:
        """The result of a read on a table not written yet (`LanceProjection._empty`)."""
        raise NotImplementedError

    def get(self, key: str) -> dict[str, Any] | None:
        """Return the live row with this key (None if absent or deleted).

        Raises InvalidType (a TypeError) when `key` is not a string: keys are strings,
        and None or a number failed deep in the quoting with a raw AttributeError.
        """
        if not isinstance(key, str):
            raise InvalidType(f"key of table {self.name!r} must be a string, got "
                              f"{type(key).__name__} {key!r:.80}", field=self.key)
        tbl = self.raw
        if tbl is None:
            return None
        with self._reading():
            found = tbl.search().where(f"{sql_name(self.key)} = {sql_string(key)} AND {LIVE_FILTER}"
                                       ).limit(1).to_arrow()
        rows = strip_hidden(found).to_pylist()
        return rows[0] if rows else None

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """LanceDB's refusals of a read (a column or key the table does not have, a search
        it has no index for) as one-line `ProjectionError`s naming the table, not raw
        ValueErrors listing its internal columns."""
        try:
            yield
        except (ValueError, RuntimeError) as exc:
            # RuntimeError: a data file gone or damaged ("lance error: LanceError(IO): ...",
            # with the Rust source paths of LanceDB's build machine).
            text = (plain(str(exc)).strip().splitlines() or [type(exc).__name__])[0]
            text = text.removeprefix("Invalid input, ")
            raise ProjectionError(f"reading table {self.name!r}: "
                                  f"{text.split('. Valid fields', 1)[0]}",
                                  table=self.name) from None

    def _check_limit(self, limit: object, vector: bool) -> int | None:
        # limit=0 on a filter returned every row; on a vector search 0, -1 and None all
        # said "Limit is required for ANN/KNN queries".
        if limit is None and not vector:
            return None
        try:  # any integer, numpy's included
            n = None if isinstance(limit, bool) else operator.index(limit)  # type: ignore[arg-type]
        except TypeError:
            n = None
        if n is None or n < 1:
            why = "a vector search needs a limit, " if limit is None else ""
            raise ProjectionError(f"search of table {self.name!r}: {why}limit must be a "
                                  f"positive integer, got {limit!r:.40}", table=self.name)
        return n

    def _columns(self, columns: Sequence[str] | None) -> list[str] | None:
        if columns is None:
            return None
        picked = [columns] if isinstance(columns, str) else list(columns)
        hidden = [c for c in picked if c in HIDDEN_COLUMNS]
        if hidden:
            # Selected, they were dropped from the result: a row per match, each empty.
            raise ProjectionError(f"column {hidden[0]!r} of table {self.name!r} is internal "
                                  "(readers never see tombstones)", table=self.name)
        return picked

    def to_arrow(self, *, where: str | None = None, columns: Sequence[str] | None = None) -> pa.Table:
        """Return the live rows (optionally filtered) as an Arrow table; never tombstones."""
        tbl = self.raw
        if tbl is None:
            return self._empty()
        picked = self._columns(columns)
        with self._reading():
            query = tbl.search().where(live_filter(where)).limit(None)
            if picked is not None:
                query = query.select(picked)
            return strip_hidden(query.to_arrow())

    def count(self, where: str | None = None) -> int:
        """Count the live rows (optionally filtered)."""
        tbl = self.raw
        if tbl is None:
            return 0
        with self._reading():
            return int(tbl.count_rows(live_filter(where)))

    def search(
        self,
        query: Any = None,
        *,
        where: str | None = None,
        limit: int | None = 10,
        vector_column_name: str | None = None,
        query_type: str = "auto",
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Vector, full-text or filter search over live rows, as LanceDB's `search`.

        Tombstones are filtered before the limit (a pre-filter), so `limit`
        live rows come back when that many match. Full-text search needs an
        FTS index on the table (create it on `raw`).
        """
        vector = query is not None and not isinstance(query, str)
        limit = self._check_limit(limit, vector)
        tbl = self.raw
        if tbl is None:
            return self._empty()
        picked = self._columns(columns)
        if vector and vector_column_name is None:
            # LanceDB infers the column only from a query of its dimension: a 2-d query on
            # the table's one 3-d column said "There is no vector column in the data".
            found = [f.name for f in tbl.schema if pa.types.is_fixed_size_list(f.type)]
            vector_column_name = found[0] if len(found) == 1 else None
        with self._reading():
            q = tbl.search(query, vector_column_name=vector_column_name, query_type=query_type)
            q = q.where(live_filter(where)).limit(limit)
            if picked is not None:
                q = q.select(picked)
            return strip_hidden(q.to_arrow())
