"""A test app whose `crash` kind kills its worker process (`os._exit`), the way a segfault
in a C extension or the OOM killer would: `--app tests.apps.crashy:app`.

Every run of any kind appends `<job_id> <token>` to `$JOBSPOOL_TEST_LOG` first.
"""

from __future__ import annotations

import os

from jobspool import App, Context, Job


def _log(job: Job, ctx: Context) -> None:
    path = os.environ.get("JOBSPOOL_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{job.id} {ctx.token}\n")


def crash(job: Job, ctx: Context) -> None:
    _log(job, ctx)
    os._exit(70)


def work(job: Job, ctx: Context) -> str:
    _log(job, ctx)
    return job.id


app = App(handlers={"crash": crash, "work": work})
