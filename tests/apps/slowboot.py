"""An app that a pool's child takes seconds to import (a heavy dependency), so that a
pool stopped at once stops children still booting. The pool itself imports it at once."""

from __future__ import annotations

import os
import time

from jobspool import App, Context, Job
from jobspool.queue.poolchild import POOL_PARENT_ENV

if os.environ.get(POOL_PARENT_ENV):
    time.sleep(30)


def noop(job: Job, ctx: Context) -> None:
    return None


app = App(handlers={"noop": noop})
