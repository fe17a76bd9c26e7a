"""A test app for `worker --processes`: a time-limited sync handler that returns in time
while an async one holds the event loop (`--app tests.apps.loop_block:app`).

`brief` (limit 1 s) touches `payload["startfile"]` and returns 0.3 s later, well within
its limit; `blocker` waits for that file, then blocks the loop for `payload["sleep"]`
seconds with a plain sleep, so the loop hears of `brief`'s end only after that.
`timed_blocker` is `blocker` with a time limit of 2 s: the supervisor kills its process.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio

from jobspool import App, Context, Job, Policy


def brief(job: Job, ctx: Context) -> str:
    Path(job.payload["startfile"]).touch()
    time.sleep(0.3)  # returns while the loop is held up
    return "in time"


async def blocker(job: Job, ctx: Context) -> str:
    deadline = time.monotonic() + 60
    while not Path(job.payload["startfile"]).exists() and time.monotonic() < deadline:
        await anyio.sleep(0.01)
    time.sleep(float(job.payload["sleep"]))  # holds the loop: nothing else runs on it
    return "blocked"


app = App(handlers={"brief": brief, "blocker": blocker, "timed_blocker": blocker},
          policies={"brief": Policy(timeout=1.0, max_attempts=1),
                    "blocker": Policy(max_attempts=1),
                    "timed_blocker": Policy(timeout=2.0, max_attempts=1)})
