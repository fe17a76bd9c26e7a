"""The idle-pickup probe's handler: appends the delay from enqueue to start (seconds)."""

from __future__ import annotations

import os
import time
from typing import Any

from jobspool import App


def ping(job: Any, ctx: Any) -> None:
    with open(os.environ["HOTPATH_LAT"], "a", encoding="utf-8") as f:
        f.write(f"{time.time() - job.payload['t']:.6f}\n")


app = App(handlers={"ping": ping})
