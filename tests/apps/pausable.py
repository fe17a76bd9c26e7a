"""A test app whose `slow` handler logs `<job id> <token>` to `$JOBSPOOL_TEST_LOG` when it
starts, then sleeps half a second: `--app tests.apps.pausable:app`."""

from __future__ import annotations

import os
import time

from jobspool import App, Context, Job


def slow(job: Job, ctx: Context) -> None:
    with open(os.environ["JOBSPOOL_TEST_LOG"], "a", encoding="utf-8") as f:
        f.write(f"{job.id} {ctx.token}\n")
    time.sleep(0.5)


app = App(handlers={"slow": slow})
