"""An app whose import takes seconds (a heavy dependency) and says when it began, so that
a test can interrupt a command while `--app` is still importing."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobspool import App, Context, Job

if marker := os.environ.get("SLOWIMPORT_MARKER"):
    Path(marker).write_text("importing")
    time.sleep(20)


def noop(job: Job, ctx: Context) -> None:
    return None


app = App(handlers={"noop": noop})
