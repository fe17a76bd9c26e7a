"""A test app for tests/test_audit11_pool.py: handlers that take their own process down.

`poison` SIGKILLs the process running it (a segfaulting C extension, the OOM
killer), after appending the pid to `payload["pidfile"]`; its policy allows
fewer attempts than a job's default (5), with a short backoff, so a test sees
the kind's policy decide when a job that keeps killing its worker is dead-lettered.

`gil` and `gil_retried` hold the interpreter itself past their time limit (a
regular expression backtracking in C never lets another thread run), so
their process cannot even fail the job: the supervisor must kill it.
`gil_fenced` does it inside `ctx.fenced()`, holding the spool's lock too,
once `poison_waits` (in another process) has started; that one then kills
its own process, so the supervisor has a dead child's jobs to settle while
the spool's lock is held by a frozen one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from jobspool import App, Context, Job, Policy


def poison(job: Job, ctx: Context) -> None:
    with open(job.payload["pidfile"], "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def gil(job: Job, ctx: Context) -> None:
    re.match(r"(a+)+$", "a" * 48 + "b")  # 2**48 steps in C, holding the GIL


def poison_waits(job: Job, ctx: Context) -> None:
    Path(job.payload["started"]).touch()
    deadline = time.monotonic() + 60
    while not Path(job.payload["frozen"]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)


def gil_fenced(job: Job, ctx: Context) -> None:
    deadline = time.monotonic() + 60
    while not Path(job.payload["started"]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    with ctx.fenced():
        Path(job.payload["frozen"]).touch()
        gil(job, ctx)


def chatty(job: Job, ctx: Context) -> str:
    """Print 200 KB, far more than a pipe holds, as print-debugging handlers do."""
    for i in range(2000):
        print(f"{job.payload['n']}:{i} " + "x" * 96)
    return "ok"


def shellout(job: Job, ctx: Context) -> str:
    """Write around `sys.stdout`: a child process and the descriptor itself."""
    subprocess.run([sys.executable, "-c", "print('child wrote this')"], check=True)
    os.write(1, b"fd1 wrote this\n")
    return "ok"


def quick(job: Job, ctx: Context) -> str:
    return "ok"


app = App(
    handlers={"poison": poison, "quick": quick, "gil": gil, "gil_retried": gil,
              "poison_waits": poison_waits, "gil_fenced": gil_fenced, "chatty": chatty,
              "shellout": shellout},
    policies={"poison": Policy(max_attempts=2, retry_base_seconds=0.05,
                               retry_max_seconds=0.05),
              # retry_on without TimeLimitExceeded: a time limit dead-letters at once.
              "gil": Policy(timeout=1, max_attempts=3, retry_on=(OSError,)),
              "gil_retried": Policy(timeout=1, max_attempts=2, retry_base_seconds=0.05,
                                    retry_max_seconds=0.05),
              "poison_waits": Policy(max_attempts=1),
              "gil_fenced": Policy(timeout=1, max_attempts=1)},
)
