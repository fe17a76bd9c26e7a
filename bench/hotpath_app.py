"""The idle-pickup probe's handler: appends its job id and its start time (epoch seconds)."""

from __future__ import annotations

import os
import time
from typing import Any

from jobspool import App


def ping(job: Any, ctx: Any) -> None:
    with open(os.environ["HOTPATH_LAT"], "a", encoding="utf-8") as f:
        f.write(f"{job.id} {time.time():.6f}\n")


app = App(handlers={"ping": ping})
