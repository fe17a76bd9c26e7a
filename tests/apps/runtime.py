"""A test app for the handler runtime: `--app tests.apps.runtime:app`.

Handlers leave evidence a test can read from another process: `pidfile`
(the payload's) gets this process's pid when a handler starts, `startfile`
is created when it starts, and every handler writes a row to the `notes`
projection table before it does anything slow, so a discarded run shows as
a row that never reached the table.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio

from jobspool import App, Context, Job, Policy


def _evidence(job: Job, ctx: Context) -> dict[str, Any]:
    payload = job.payload if isinstance(job.payload, dict) else {}
    if payload.get("pidfile"):
        with open(payload["pidfile"], "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    if payload.get("startfile"):
        Path(payload["startfile"]).touch()
    ctx.upsert("notes", {"id": job.id, "text": f"attempt {job.attempts}"})
    return payload


def quick(job: Job, ctx: Context) -> str:
    _evidence(job, ctx)
    return "ok"


def sleepy(job: Job, ctx: Context) -> str:
    """A sync handler that sleeps `payload["sleep"]` seconds (default 60): past any limit."""
    payload = _evidence(job, ctx)
    time.sleep(float(payload.get("sleep", 60)))
    return "slept"


async def asleepy(job: Job, ctx: Context) -> str:
    payload = _evidence(job, ctx)
    await anyio.sleep(float(payload.get("sleep", 60)))
    return "slept"


def _inner_helper_that_raises(value: int) -> None:
    raise ValueError(f"bad value {value}")


def boom(job: Job, ctx: Context) -> None:
    _evidence(job, ctx)
    _inner_helper_that_raises(42)


def die(job: Job, ctx: Context) -> None:
    """Wait for `payload["killfile"]` then sleep: the test SIGKILLs this process meanwhile."""
    payload = _evidence(job, ctx)
    time.sleep(float(payload.get("sleep", 60)))


def frozen(job: Job, ctx: Context) -> None:
    """Once `payload["metricsdir"]` holds a worker snapshot, block the whole interpreter in C
    (the GIL held, SIGTERM ignored) for `payload["sleep"]` seconds: only SIGKILL ends it."""
    import ctypes
    import signal

    payload = _evidence(job, ctx)
    deadline = time.monotonic() + 60
    while not list(Path(payload["metricsdir"]).glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    Path(payload["frozenfile"]).touch()
    libc = ctypes.PyDLL(None)
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGTERM, 1)  # SIG_IGN: a sleep a signal cut short would return
    libc.sleep(int(payload.get("sleep", 600)))


def exits(job: Job, ctx: Context) -> None:
    """What a script-turned-handler does: `sys.exit(3)` (or Ctrl-C's KeyboardInterrupt)."""
    if job.payload == "interrupt":
        raise KeyboardInterrupt
    raise SystemExit(3)


def progressing(job: Job, ctx: Context) -> str:
    """Report 40/100, then wait (bounded) for `payload["releasefile"]` to appear."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    ctx.progress(40, 100, "resizing")
    deadline = time.monotonic() + 60
    while not Path(payload["releasefile"]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return "done"


app = App(
    handlers={"quick": quick, "sleepy": sleepy, "asleepy": asleepy, "boom": boom, "die": die,
              "grace": sleepy, "progressing": progressing, "exits": exits, "frozen": frozen},
    policies={
        "sleepy": Policy(timeout=1.0, max_attempts=2, retry_base_seconds=0.05,
                         retry_max_seconds=0.05),
        "asleepy": Policy(timeout=0.5, max_attempts=1),
        "boom": Policy(max_attempts=1),
        "exits": Policy(max_attempts=2, retry_base_seconds=0.01, retry_max_seconds=0.01),
        "die": Policy(max_attempts=3, retry_base_seconds=0.05, retry_max_seconds=0.05),
    },
)
