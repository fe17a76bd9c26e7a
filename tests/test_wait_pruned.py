"""`wait` for a job that finished and was pruned before the waiter's next look, both stores.

Found by a DESIGN audit of the PostgreSQL store: with keep_terminal=0 (and on PostgreSQL,
which prunes at a process's first terminal write, every time) the waiter got `JobNotFound`
("not found"), as for an id that never existed, though the job had completed. Now it is
`JobPruned`, a `JobNotFound` that says the job finished and was pruned."""

from __future__ import annotations

import threading
from collections.abc import Callable

import anyio
import pytest

from jobspool import AsyncSpool, Spool
from jobspool.errors import JobNotFound, JobPruned


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_job_pruned_as_it_finished_is_said_to_be_pruned(
        make_any_spool: Callable[..., Spool], flavour: str) -> None:
    spool = make_any_spool(keep_terminal=0)
    job = spool.enqueue("k", {})
    other = make_any_spool(keep_terminal=0)
    polled, finished = threading.Event(), threading.Event()
    real_get = spool.get
    looks = [0]

    def get(job_id: str) -> object:
        looks[0] += 1
        if looks[0] == 2:  # the next look comes after the job finished and was pruned
            finished.wait(30)
        found = real_get(job_id)
        polled.set()
        return found

    spool.get = get  # type: ignore[method-assign]

    def finish() -> None:
        polled.wait(30)  # the waiter saw it unfinished
        (lease,) = other.claim(kinds="k")
        other.complete(lease)
        other.prune()  # retention keeps none
        finished.set()

    helper = threading.Thread(target=finish)
    helper.start()
    try:
        with pytest.raises(JobPruned) as info:
            if flavour == "sync":
                spool.wait(job.id, timeout=30)
            else:
                anyio.run(_await_wait, spool, job.id)
    finally:
        helper.join(30)
    assert isinstance(info.value, JobNotFound) and info.value.job_id == job.id
    assert "finished and was pruned" in str(info.value)


async def _await_wait(spool: Spool, job_id: str) -> None:
    await AsyncSpool(spool).wait(job_id, timeout=30)


def test_an_id_never_seen_is_still_just_not_found(any_spool: Spool) -> None:
    with pytest.raises(JobNotFound) as info:
        any_spool.wait("never-there", timeout=1)
    assert not isinstance(info.value, JobPruned)
