"""A handler deep in its recursion limit cannot leak the store's connections.

A handler that catches `RecursionError` (a `try: walk(tree) except Exception:` around a
spool call) got it inside the pool's `give`, before the connection's slot was counted
back: each such call leaked a slot for good. With all 16 gone every statement waited for
a connection ("no free connection within 10s"), and `close()` waited for ever.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from tests.spools import make_spool


def _deep(n: int, fn: Callable[[], Any]) -> Any:
    return fn() if n <= 0 else _deep(n - 1, fn)


def _at_every_depth_near_the_limit(fn: Callable[[], Any]) -> None:
    limit, here = sys.getrecursionlimit(), len(traceback.extract_stack())
    for margin in range(1, 120):
        with contextlib.suppress(RecursionError):
            _deep(limit - here - margin, fn)


def test_recursion_errors_inside_spool_calls_leak_no_connection(pg_url: str) -> None:
    spool = make_spool(pg_url)
    job = spool.enqueue("k", {})
    pool = spool.db._get_pool()  # type: ignore[attr-defined]
    for _ in range(20):  # more sweeps than the pool has connections
        _at_every_depth_near_the_limit(lambda: spool.get(job.id))
    assert pool._busy == 0
    assert spool.get(job.id).id == job.id
    closed = threading.Thread(target=spool.close, daemon=True)
    closed.start()
    closed.join(60)  # a hang guard, never a timing claim
    assert not closed.is_alive(), "close() waited for connections never given back"
