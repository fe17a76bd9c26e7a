"""Cursors a connection keeps per hot statement (`execute_hot`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

# Where a connection keeps its cursors for `execute_hot` (an attribute of its own: the
# cursors live and die with it, and a connection is used by one thread at a time).
_HOT_CURSORS = "_jobspool_hot_cursors"


def execute_hot(conn: psycopg.Connection[Any], query: str, params: Any, *,
                binary: bool = False) -> psycopg.Cursor[Any]:
    """`conn.execute(query, params)` on a cursor the connection keeps for this statement.

    For the statements sent once per call or batch whose rows are small (the enqueue's
    INSERT, the settles): `conn.execute` makes a cursor each time, and its new
    `Transformer` looks up every parameter's dumper and every column's loader again. A
    cursor that executes the same query object again keeps them (psycopg's own
    `_last_query` check), so each statement gets its own cursor. The caller reads the
    rows before the next statement on the connection, as it does with `conn.execute`.

    A kept cursor also keeps its last result until it runs again: not for statements
    that return payloads (the claim, whose text varies with its limit: one cursor per
    limit held each limit's last claimed rows, 2.7 GB for a caller claiming 1..300 jobs
    of 60 KB), and at most `_HOT_MAX` per connection; past that, `conn.execute`.
    """
    cursors: dict[str, psycopg.Cursor[Any]] | None = getattr(conn, _HOT_CURSORS, None)
    if cursors is None:
        cursors = {}
        setattr(conn, _HOT_CURSORS, cursors)
    cur = cursors.get(query)
    if cur is None:
        if len(cursors) >= _HOT_MAX:
            return conn.execute(query, params, binary=binary)
        cur = cursors[query] = conn.cursor()
    return cur.execute(query, params, binary=binary)


_HOT_MAX = 8
