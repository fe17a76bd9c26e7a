"""An app whose pool children die at start-up (the supervisor itself loads it fine)."""

from __future__ import annotations

import os

from jobspool import App

if os.environ.get("JOBSPOOL_POOL_FD"):
    raise SystemExit(7)

app = App(handlers={"work": lambda job, ctx: None})
