"""Writers in spawned processes released together at a barrier (tests of races between
processes): `at_once(target, n, *args)` calls `target(index, *args, barrier)` in `n`
processes and fails the test if any of them did not exit cleanly."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def at_once(target: Callable[..., None], n: int, *args: Any, timeout: float = 300) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=target, args=(i, *args, barrier)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
        assert p.exitcode == 0, f"writer process {p.pid} ended with {p.exitcode}"
