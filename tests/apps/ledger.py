"""A test app that keeps a ledger of every run: `--app tests.apps.ledger:app`.

Handlers append one line per event to `$JOBSPOOL_TEST_LOG` with a single
`write()` to a descriptor opened `O_APPEND`, so lines from concurrent
processes never interleave and their order in the file is the order the
writes happened:

- `run <job_id> <token> <pid>` when a handler starts working on a job;
- `commit <job_id> <token> <pid>` (kind `fenced` only) from inside
  `ctx.fenced()`, i.e. under the spool lock while the lease was current.

Every handler returns `{"token": ctx.token}`, so the completed file names the
run whose completion was accepted.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from jobspool import App, Context, Job


def _append(line: str) -> None:
    path = os.environ.get("JOBSPOOL_TEST_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def record(job: Job, ctx: Context) -> dict[str, Any]:
    """Log the run and complete with this run's token."""
    _append(f"run {job.id} {ctx.token} {os.getpid()}\n")
    return {"token": ctx.token}


def fenced(job: Job, ctx: Context) -> dict[str, Any]:
    """Log the run, work a little (a window for kills and lock deletions), then log a
    commit from inside `ctx.fenced()` and complete with this run's token."""
    _append(f"run {job.id} {ctx.token} {os.getpid()}\n")
    time.sleep(random.uniform(0.0, 0.004))
    with ctx.fenced():
        _append(f"commit {job.id} {ctx.token} {os.getpid()}\n")
    return {"token": ctx.token}


app = App(handlers={"record": record, "fenced": fenced})
