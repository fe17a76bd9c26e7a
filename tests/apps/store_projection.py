"""An app whose projection is a `ProjectionStore` (what declaring `schemas=` needs), at
`$JOBSPOOL_TEST_PROJECTION`, keyed by `path` (tests/test_maintain_app_store.py)."""

from __future__ import annotations

import os

from jobspool import App, Context, Job
from jobspool.projection import ProjectionStore

KEYS = {"docs": "path"}


def doc(job: Job, ctx: Context) -> None:
    ctx.upsert("docs", {"path": job.id, "words": 3})


app = App(handlers={"doc": doc},
          projection=ProjectionStore(os.environ["JOBSPOOL_TEST_PROJECTION"], keys=KEYS),
          keys=KEYS)
