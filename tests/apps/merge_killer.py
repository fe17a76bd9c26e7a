"""A test app whose projection merge kills its worker process once the merge committed, the
way the OOM killer would in the middle of a large merge: `--app tests.apps.merge_killer:app`.
The projection directory is `$JOBSPOOL_TEST_PROJECTION`."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any

from jobspool import App, Context, Job
from jobspool.projection import lance

_apply = lance.ProjectionStore.apply


def _apply_then_die(self: lance.ProjectionStore, writes: Sequence[Any]) -> Any:
    out = _apply(self, writes)
    if writes:
        os.kill(os.getpid(), signal.SIGKILL)
    return out


lance.ProjectionStore.apply = _apply_then_die  # type: ignore[method-assign]


def write(job: Job, ctx: Context) -> None:
    ctx.upsert("kv", {"id": job.id, "val": 1})


app = App(handlers={"write": write}, projection=os.environ["JOBSPOOL_TEST_PROJECTION"])
