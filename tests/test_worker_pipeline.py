"""The pipeline driven without a `Worker`: it is handed its spool, a `WorkerConfig`, a
projection sink, a `Supervisor` and a lifecycle, and needs nothing else (issue 15)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

from jobspool import Context, Job, JobState, Spool
from jobspool.queue.config import WorkerConfig
from jobspool.queue.context import Completed, Failed
from jobspool.queue.pipeline import Pipeline
from jobspool.queue.report import Counters
from jobspool.queue.sink import NoProjection
from jobspool.queue.supervisor import Supervisor


class Life:
    """A lifecycle that records what the pipeline tells it."""

    def __init__(self) -> None:
        self.stopping = False
        self.hurrying = False
        self.started: list[str] = []
        self.ended: list[tuple[str, str]] = []
        self.final_published = False

    def stop(self) -> None:
        self.stopping = True

    def publish(self, counters: Counters, *, final: bool = False) -> None:
        self.final_published = self.final_published or final

    def note_start(self, ctx: Context) -> None:
        self.started.append(ctx.job_id)

    def note_end(self, ctx: Context) -> None:
        self.ended.append((ctx.job_id, type(ctx.outcome).__name__))

    def note_began(self, ctx: Context) -> None:
        pass

    def note_returned(self, ctx: Context) -> None:
        pass

    def note_hung(self, ctx: Context) -> None:
        raise AssertionError("no handler here runs past a time limit")


def drain(spool: Spool, handlers: Mapping[str, Any], life: Life) -> Counters:
    config = WorkerConfig.create(handlers, owner="test-pipeline", lease_seconds=None,
                                 default_lease_seconds=spool.lease_seconds,
                                 retry_base_seconds=spool.retry_base_seconds,
                                 retry_max_seconds=spool.retry_max_seconds)
    counters = Counters()
    pipeline = Pipeline(spool, config, counters, NoProjection(), Supervisor(), life,
                        until_idle=True)
    anyio.run(pipeline.run)
    return counters


def test_a_pipeline_runs_handlers_and_tells_its_lifecycle_with_typed_outcomes(
        spool: Spool) -> None:
    spool.enqueue("note", {"n": 1}, job_id="a")

    def note(job: Job, ctx: Context) -> int:
        return int(job.payload["n"]) + 1

    life = Life()
    counters = drain(spool, {"note": note}, life)
    assert (counters.claimed, counters.completed) == (1, 1)
    assert spool.get("a").state is JobState.COMPLETED and spool.get("a").result == 2
    assert (life.started, life.ended) == (["a"], [("a", Completed.__name__)])


def test_a_job_writing_rows_through_a_sink_that_projects_nothing_is_dead_lettered_not_dropped(
        spool: Spool) -> None:
    spool.enqueue("note", job_id="writes")
    spool.enqueue("note", job_id="quiet")

    def note(job: Job, ctx: Context) -> None:
        if job.id == "writes":
            ctx.upsert("notes", {"id": job.id})

    counters = drain(spool, {"note": note}, Life())
    assert (counters.completed, counters.dead_lettered, counters.projected_rows) == (1, 1, 0)
    dead = spool.get("writes")
    assert dead.state is JobState.DEAD_LETTER
    assert "this worker has no projection" in (dead.last_error or "")
    assert "'notes'" in (dead.last_error or "")
    assert spool.get("quiet").state is JobState.COMPLETED


def test_outcomes_are_frozen_values_compared_by_type_and_content() -> None:
    outcomes: list[object] = [Completed(3), Completed(3), Failed("3")]
    assert outcomes[0] == outcomes[1] and outcomes[0] != outcomes[2]
    assert hash(Failed("no")) == hash(Failed("no"))
