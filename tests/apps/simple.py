"""A test app: `--app tests.apps.simple:app`.

Every handler appends one line `<job_id> <pid> <token> <attempt>` to a log
file before it returns, so a test can count how often each job was handled.
The file is the payload's `log` entry when there is one, else
`$JOBSPOOL_TEST_LOG`, else nothing is logged.
"""

from __future__ import annotations

import os
import time
from typing import Any

from jobspool import App, Context, Fail, Job, Retry


def _log(job: Job, ctx: Context) -> None:
    payload = job.payload if isinstance(job.payload, dict) else {}
    path = payload.get("log") or os.environ.get("JOBSPOOL_TEST_LOG")
    if not path:
        return
    # One write() of one short line to an O_APPEND file: lines never interleave.
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{job.id} {os.getpid()} {ctx.token} {job.attempts}\n")


def work(job: Job, ctx: Context) -> dict[str, Any]:
    """Quick job (or `payload["sleep"]` seconds long): log it and return who ran it."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    _log(job, ctx)
    return {"pid": os.getpid(), "token": ctx.token}


def slow(job: Job, ctx: Context) -> dict[str, Any]:
    """Touch `payload["started"]` if given, sleep `payload["sleep"]` seconds (default 0.3),
    then log and complete."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    if payload.get("started"):
        # Leased is not started: a worker told to stop gives back what it has not begun.
        open(payload["started"], "a").close()
    time.sleep(float(payload.get("sleep", 0.3)))
    _log(job, ctx)
    return {"pid": os.getpid(), "slept": payload.get("sleep", 0.3)}


async def awork(job: Job, ctx: Context) -> str:
    """An async handler."""
    _log(job, ctx)
    return "async ok"


def flaky(job: Job, ctx: Context) -> str:
    """Ask for a retry until the third attempt."""
    if job.attempts < 3:
        raise Retry("not yet", delay=0.05)
    _log(job, ctx)
    return "third time lucky"


def poison(job: Job, ctx: Context) -> None:
    """Always fail permanently."""
    raise Fail("poison pill")


def boom(job: Job, ctx: Context) -> None:
    """Always raise an ordinary exception (retried with backoff, then dead-lettered)."""
    raise RuntimeError("boom")


app = App(handlers={"work": work, "slow": slow, "awork": awork, "flaky": flaky,
                    "poison": poison, "boom": boom})

# `--app tests.apps.simple:only_work` handles one kind only.
only_work = App(handlers={"work": work})
