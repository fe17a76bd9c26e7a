"""A handler that changes the claimed job's payload in place cannot strand its job.

Handlers get a payload of their own (`ctx.job`), but `ctx.lease.job` is the claim's
snapshot, which PostgreSQL settles from: a handler that put a set into
`ctx.lease.job.payload` left its job leased ("could not record ... not
JSON-serializable"), to run again at every expiry and end dead-lettered as a dead
worker's. The file spool settles from the file and never noticed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobspool import JobState, Spool, Worker


@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_a_mutated_lease_payload_still_settles(make_any_spool: Callable[..., Spool],
                                               outcome: str) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    job = spool.enqueue("k", {"a": 1}, max_attempts=1)
    runs = []

    def handler(j: Any, ctx: Any) -> dict[str, int]:
        runs.append(j.id)
        ctx.lease.job.payload["emb"] = {1.0, 2.0}  # a set: JSON cannot carry it
        if outcome == "raises":
            raise RuntimeError("failed after touching the payload")
        return {"ok": 1}

    report = Worker(spool, {"k": handler}).run_until_idle()
    done = spool.get(job.id)
    if outcome == "returns":
        assert report.completed == 1
        assert (done.state, done.result) == (JobState.COMPLETED, {"ok": 1})
    else:
        assert report.dead_lettered == 1
        assert done.state is JobState.DEAD_LETTER
        assert "failed after touching the payload" in (done.last_error or "")
    assert done.payload == {"a": 1}
    assert runs == [job.id]
