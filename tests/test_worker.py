"""The Worker in one process: how each handler outcome settles a job, the concurrency
bound, max_jobs, waiting for retries, unhandled kinds, results that cannot be stored,
the context's fencing helpers, lost leases, projection writes and the supervised loop.

Time-dependent rules run on the injected fake clock (conftest's `spool` fixture);
the real clock appears only where the worker's own timers matter.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import App, Context, Fail, Job, JobState, Retry, Spool, Worker
from jobspool.errors import InvalidJob, JobspoolError, LeaseLost
from jobspool.queue.worker import WorkerCrashed
from tests.conftest import FakeClock
from tests.helpers_spool import job_files
from tests.spools import SpoolFactory, make_spool

Handler = Callable[[Job, Context], Any]


def as_async(fn: Handler) -> Handler:
    """The same handler, as a coroutine function (run on the event loop, not in a thread)."""

    async def handler(job: Job, ctx: Context) -> Any:
        return fn(job, ctx)

    return handler


@pytest.fixture(params=["sync", "async"])
def flavor(request: pytest.FixtureRequest) -> Callable[[Handler], Handler]:
    """Every outcome test runs once with a sync handler and once with an async one."""
    if request.param == "sync":
        return lambda fn: fn
    return as_async


def only(spool: Spool, state: JobState | str | None = None) -> list[Job]:
    return list(spool.jobs(state=state))


# ---------------------------------------------------------------- handler outcomes


def test_returning_completes_the_job_with_the_result(spool: Spool, flavor: Any) -> None:
    job = spool.enqueue("work", {"n": 21})
    report = Worker(spool, {"work": flavor(lambda j, c: {"double": j.payload["n"] * 2})}
                    ).run_until_idle()
    assert (report.claimed, report.completed, report.retried, report.dead_lettered) == (1, 1, 0, 0)
    assert report.lease_lost == 0
    done = spool.get(job.id)
    assert done.state is JobState.COMPLETED
    assert done.result == {"double": 42}
    assert done.attempts == 1
    assert done.lease is None
    assert job_files(spool.root) == {job.id: ["completed"]}


def test_returning_none_completes_with_a_null_result(spool: Spool, flavor: Any) -> None:
    job = spool.enqueue("work")
    Worker(spool, {"work": flavor(lambda j, c: None)}).run_until_idle()
    done = spool.get(job.id)
    assert done.state is JobState.COMPLETED
    assert done.result is None


def test_retry_with_delay_makes_the_job_retryable_at_that_delay(
        spool: Spool, clock: FakeClock, flavor: Any) -> None:
    job = spool.enqueue("work")

    def handler(j: Job, c: Context) -> None:
        raise Retry("upstream busy", delay=42.0)

    report = Worker(spool, {"work": flavor(handler)}).run_until_idle()
    assert (report.completed, report.retried, report.dead_lettered) == (0, 1, 0)
    after = spool.get(job.id)
    assert after.state is JobState.RETRYABLE
    assert after.run_at == pytest.approx(clock.now + 42.0)
    assert after.attempts == 1
    assert after.last_error is not None and "upstream busy" in after.last_error
    # Not due yet: a second run finds nothing to do.
    again = Worker(spool, {"work": flavor(handler)}).run_until_idle()
    assert again.claimed == 0
    # Once due, it runs again as attempt 2.
    clock.advance(42.0)
    Worker(spool, {"work": flavor(lambda j, c: j.attempts)}).run_until_idle()
    assert spool.get(job.id).state is JobState.COMPLETED
    assert spool.get(job.id).result == 2


def test_fail_dead_letters_at_once_without_using_the_remaining_attempts(
        spool: Spool, flavor: Any) -> None:
    job = spool.enqueue("work", max_attempts=5)

    def handler(j: Job, c: Context) -> None:
        raise Fail("malformed document")

    report = Worker(spool, {"work": flavor(handler)}).run_until_idle()
    assert (report.completed, report.retried, report.dead_lettered) == (0, 0, 1)
    dead = spool.get(job.id)
    assert dead.state is JobState.DEAD_LETTER
    assert dead.attempts == 1
    assert dead.last_error is not None and "malformed document" in dead.last_error
    assert job_files(spool.root) == {job.id: ["dead_letter"]}


def test_other_exceptions_retry_with_backoff_until_max_attempts_then_dead_letter(
        make_spool: SpoolFactory, clock: FakeClock, flavor: Any) -> None:
    spool = make_spool(clock=clock, lease_seconds=30.0,
                       retry_base_seconds=1.0, retry_max_seconds=8.0)
    job = spool.enqueue("work", max_attempts=3)
    calls: list[int] = []

    def handler(j: Job, c: Context) -> None:
        calls.append(j.attempts)
        raise ValueError(f"bad input on attempt {j.attempts}")

    worker = Worker(spool, {"work": flavor(handler)})
    for attempt in (1, 2):
        report = worker.run_until_idle()
        assert (report.retried, report.dead_lettered) == (1, 0)
        after = spool.get(job.id)
        assert after.state is JobState.RETRYABLE
        assert after.attempts == attempt
        # Backoff: not due now, due within the cap.
        assert clock.now < after.run_at <= clock.now + 8.0 + 1e-6
        assert "ValueError" in (after.last_error or "")
        assert f"attempt {attempt}" in (after.last_error or "")
        assert worker.run_until_idle().claimed == 0  # not due yet
        clock.advance(8.0)
    report = worker.run_until_idle()
    assert (report.retried, report.dead_lettered) == (0, 1)
    dead = spool.get(job.id)
    assert dead.state is JobState.DEAD_LETTER
    assert dead.attempts == 3
    assert "attempt 3" in (dead.last_error or "")
    assert calls == [1, 2, 3]


def test_async_handler_runs_on_the_event_loop_and_sync_handler_in_a_thread(spool: Spool) -> None:
    spool.enqueue("a")
    spool.enqueue("s")
    seen: dict[str, bool] = {}

    async def a(job: Job, ctx: Context) -> None:
        await anyio.sleep(0)  # a real coroutine: awaits work inside the handler
        seen["a_main"] = threading.current_thread() is threading.main_thread()

    def s(job: Job, ctx: Context) -> None:
        seen["s_main"] = threading.current_thread() is threading.main_thread()

    report = Worker(spool, {"a": a, "s": s}).run_until_idle()
    assert report.completed == 2
    assert seen == {"a_main": True, "s_main": False}


def test_a_callable_object_with_an_async_call_is_awaited(spool: Spool) -> None:
    job = spool.enqueue("work")

    class Handler:
        async def __call__(self, job: Job, ctx: Context) -> str:
            await anyio.sleep(0)
            return "from __call__"

    Worker(spool, {"work": Handler()}).run_until_idle()
    assert spool.get(job.id).result == "from __call__"


@pytest.mark.parametrize("delay", [float("nan"), float("inf"), "soon", 1e12],
                         ids=["nan", "inf", "str", "past-year-9999"])
def test_a_nonsense_retry_delay_is_a_handler_fault_not_a_corrupt_file_or_a_dead_worker(
        spool: Spool, delay: Any) -> None:
    """`Retry(delay=...)` comes from user code: a NaN/inf delay must not be written as a
    job file nobody can read, and a wrong type must not crash the worker's loop."""
    job = spool.enqueue("work")
    other = spool.enqueue("work", "fine")

    def handler(j: Job, c: Context) -> str:
        if j.payload != "fine":
            raise Retry("bad delay", delay=delay)
        return "ok"

    report = Worker(spool, {"work": handler}, max_crashes=2).run_until_idle()
    assert report.crashes == 0
    assert spool.get(other.id).state is JobState.COMPLETED
    after = spool.get(job.id)  # readable, not skipped as a corrupt file
    assert after.state in (JobState.RETRYABLE, JobState.DEAD_LETTER)
    assert after.attempts == 1 and "Retry(delay=...)" in (after.last_error or "")
    assert report.retried + report.dead_lettered == 1  # not left leased, uncounted
    assert spool.fsck().ok


def test_a_failure_the_store_refuses_as_given_is_recorded_plainly(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should the store refuse a failure's retry delay, the job is still failed (normal
    backoff, the refusal in its error), not left leased until its lease expires."""
    job = spool.enqueue("work")
    real = spool.fail_many

    def picky(items: Any) -> list[Any]:
        out = real([it for it in items if it[3] is None])
        it = iter(out)
        return [InvalidJob("this store takes no delay") if item[3] is not None else next(it)
                for item in items]

    monkeypatch.setattr(spool, "fail_many", picky)

    def handler(j: Job, c: Context) -> None:
        raise Retry("later", delay=5.0)

    report = Worker(spool, {"work": handler}).run_until_idle()
    after = spool.get(job.id)
    assert after.state is JobState.RETRYABLE and report.retried == 1
    assert "Retry: later" in (after.last_error or "") and "takes no delay" in after.last_error


def test_a_mixed_batch_settles_every_job_by_its_own_outcome(spool: Spool) -> None:
    ids = {name: spool.enqueue("work", name).id for name in ("ok", "retry", "fail", "boom")}

    def handler(job: Job, ctx: Context) -> str:
        if job.payload == "retry":
            raise Retry("later", delay=5.0)
        if job.payload == "fail":
            raise Fail("never")
        if job.payload == "boom":
            raise KeyError("boom")
        return "fine"

    report = Worker(spool, {"work": handler}, batch_size=10).run_until_idle()
    assert (report.claimed, report.completed, report.retried, report.dead_lettered) == (4, 1, 2, 1)
    assert spool.get(ids["ok"]).state is JobState.COMPLETED
    assert spool.get(ids["retry"]).state is JobState.RETRYABLE
    assert spool.get(ids["fail"]).state is JobState.DEAD_LETTER
    assert spool.get(ids["boom"]).state is JobState.RETRYABLE


# ---------------------------------------------------------------- concurrency


class Gauge:
    """Counts handlers running at this instant, and the most ever seen at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.max = 0
        self.total = 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.total += 1
            self.max = max(self.max, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


@pytest.mark.parametrize("concurrency", [1, 3])
def test_sync_handlers_never_exceed_the_concurrency_bound_and_reach_it(
        spool: Spool, concurrency: int) -> None:
    spool.enqueue_many("work", [{"i": i} for i in range(12)])
    gauge = Gauge()

    def handler(job: Job, ctx: Context) -> None:
        gauge.enter()
        try:
            time.sleep(0.1)
        finally:
            gauge.leave()

    report = Worker(spool, {"work": handler}, concurrency=concurrency).run_until_idle()
    assert report.completed == 12
    assert gauge.total == 12
    assert gauge.max == concurrency


def test_async_handlers_never_exceed_the_concurrency_bound_and_reach_it(spool: Spool) -> None:
    spool.enqueue_many("work", [{"i": i} for i in range(12)])
    gauge = Gauge()

    async def handler(job: Job, ctx: Context) -> None:
        gauge.enter()
        try:
            await anyio.sleep(0.1)
        finally:
            gauge.leave()

    report = Worker(spool, {"work": handler}, concurrency=3).run_until_idle()
    assert report.completed == 12
    assert gauge.max == 3


def test_sync_and_async_handlers_share_one_bound(spool: Spool) -> None:
    spool.enqueue_many("s", [{"i": i} for i in range(6)])
    spool.enqueue_many("a", [{"i": i} for i in range(6)])
    gauge = Gauge()

    def s(job: Job, ctx: Context) -> None:
        gauge.enter()
        try:
            time.sleep(0.1)
        finally:
            gauge.leave()

    async def a(job: Job, ctx: Context) -> None:
        gauge.enter()
        try:
            await anyio.sleep(0.1)
        finally:
            gauge.leave()

    report = Worker(spool, {"s": s, "a": a}, concurrency=2, batch_size=12).run_until_idle()
    assert report.completed == 12
    assert gauge.max == 2


# ---------------------------------------------------------------- run_until_idle options


def test_a_kind_without_a_handler_is_left_ready_and_reported_as_unhandled(spool: Spool) -> None:
    mine = spool.enqueue("work")
    theirs = [spool.enqueue("other").id, spool.enqueue("other").id]
    report = Worker(spool, {"work": lambda j, c: "ok"}).run_until_idle()
    assert report.claimed == 1 and report.completed == 1
    assert report.unhandled == {"other": 2}
    assert spool.get(mine.id).state is JobState.COMPLETED
    for job_id in theirs:
        job = spool.get(job_id)
        assert job.state is JobState.READY
        assert job.attempts == 0  # never claimed, not even briefly
        assert job.revision == 1


def test_kinds_restricts_a_worker_to_some_of_its_handlers(spool: Spool) -> None:
    a = spool.enqueue("a")
    b = spool.enqueue("b")
    report = Worker(spool, {"a": lambda j, c: 1, "b": lambda j, c: 2}, kinds=["a"]).run_until_idle()
    assert report.completed == 1
    assert spool.get(a.id).state is JobState.COMPLETED
    assert spool.get(b.id).state is JobState.READY


def test_max_jobs_stops_after_that_many_claims(spool: Spool) -> None:
    jobs = spool.enqueue_many("work", [{"i": i} for i in range(10)])
    report = Worker(spool, {"work": lambda j, c: j.payload["i"]}, batch_size=3
                    ).run_until_idle(max_jobs=4)
    assert report.claimed == 4
    assert report.completed == 4
    # FIFO: the first four enqueued are the ones done.
    assert [spool.get(j.id).state for j in jobs] == [JobState.COMPLETED] * 4 + [JobState.READY] * 6


def test_max_jobs_zero_claims_nothing(spool: Spool) -> None:
    spool.enqueue("work")
    report = Worker(spool, {"work": lambda j, c: None}).run_until_idle(max_jobs=0)
    assert report.claimed == 0
    assert only(spool, "ready")[0].attempts == 0


def test_run_until_idle_on_an_empty_spool_returns_an_empty_report(spool: Spool) -> None:
    report = Worker(spool, {"work": lambda j, c: None}).run_until_idle()
    assert (report.claimed, report.completed, report.retried, report.dead_lettered,
            report.lease_lost, report.released) == (0, 0, 0, 0, 0, 0)
    assert report.unhandled == {}
    assert report.duration >= 0
    d = report.to_dict()
    for key in ("claimed", "completed", "retried", "dead_lettered", "lease_lost", "released",
                "duration", "unhandled", "rate"):
        assert key in d


def test_without_wait_for_retries_a_pending_retry_is_left_for_later(make_spool: SpoolFactory) -> None:
    spool = make_spool()
    job = spool.enqueue("work")

    def handler(j: Job, c: Context) -> str:
        if j.attempts == 1:
            raise Retry("soon", delay=0.3)
        return "second"

    report = Worker(spool, {"work": handler}).run_until_idle()
    assert (report.completed, report.retried) == (0, 1)
    assert spool.get(job.id).state is JobState.RETRYABLE


def test_wait_for_retries_waits_for_a_retry_due_within_the_bound(make_spool: SpoolFactory) -> None:
    spool = make_spool()
    job = spool.enqueue("work")

    def handler(j: Job, c: Context) -> str:
        if j.attempts == 1:
            raise Retry("soon", delay=0.3)
        return "second"

    report = Worker(spool, {"work": handler}).run_until_idle(wait_for_retries=10.0)
    assert (report.claimed, report.completed, report.retried) == (2, 1, 1)
    done = spool.get(job.id)
    assert done.state is JobState.COMPLETED
    assert done.result == "second"
    assert done.attempts == 2


def test_wait_for_retries_does_not_wait_for_a_retry_due_beyond_the_bound(
        make_spool: SpoolFactory) -> None:
    spool = make_spool()
    job = spool.enqueue("work")

    def handler(j: Job, c: Context) -> None:
        raise Retry("much later", delay=3600.0)

    report = Worker(spool, {"work": handler}).run_until_idle(wait_for_retries=0.5)
    assert (report.claimed, report.retried) == (1, 1)
    assert spool.get(job.id).state is JobState.RETRYABLE


def test_progress_callback_sees_growing_counts(spool: Spool) -> None:
    spool.enqueue_many("work", [{"i": i} for i in range(7)])
    seen: list[int] = []
    Worker(spool, {"work": lambda j, c: None}, batch_size=3).run_until_idle(
        progress=lambda r: seen.append(r.completed))
    assert seen == sorted(seen)
    assert seen[-1] == 7


# ---------------------------------------------------------------- results that cannot be stored


def test_an_unserializable_result_dead_letters_the_job_with_a_clear_error(
        spool: Spool, flavor: Any) -> None:
    job = spool.enqueue("work")
    report = Worker(spool, {"work": flavor(lambda j, c: {"when": object()})}).run_until_idle()
    assert (report.completed, report.dead_lettered) == (0, 1)
    dead = spool.get(job.id)
    assert dead.state is JobState.DEAD_LETTER
    assert dead.result is None
    assert dead.last_error is not None
    assert "result" in dead.last_error and "JSON" in dead.last_error


def test_a_too_large_result_dead_letters_the_job_with_a_clear_error(
        spool: Spool, flavor: Any) -> None:
    job = spool.enqueue("work")
    report = Worker(spool, {"work": flavor(lambda j, c: "x" * 100_000)}).run_until_idle()
    assert (report.completed, report.dead_lettered) == (0, 1)
    dead = spool.get(job.id)
    assert dead.state is JobState.DEAD_LETTER
    assert dead.last_error is not None and "result" in dead.last_error
    assert len(dead.last_error) <= 1024
    # The job file itself stayed within the limit.
    path = spool.root / "dead_letter" / f"{job.id}.json"
    assert path.stat().st_size <= 65536


def test_a_bad_result_does_not_spoil_the_rest_of_its_batch(spool: Spool) -> None:
    good = [spool.enqueue("work", i).id for i in range(3)]
    bad = spool.enqueue("work", "bad").id
    report = Worker(spool, {"work": lambda j, c: object() if j.payload == "bad" else "ok"}
                    ).run_until_idle()
    assert (report.completed, report.dead_lettered) == (3, 1)
    assert all(spool.get(i).state is JobState.COMPLETED for i in good)
    assert spool.get(bad).state is JobState.DEAD_LETTER


# ---------------------------------------------------------------- lost leases


def test_a_job_canceled_while_its_handler_runs_keeps_no_result(spool: Spool, flavor: Any) -> None:
    job = spool.enqueue("work")

    def handler(j: Job, c: Context) -> str:
        spool.cancel(j.id)
        return "should be discarded"

    report = Worker(spool, {"work": flavor(handler)}).run_until_idle()
    assert report.lease_lost == 1
    assert (report.completed, report.retried, report.dead_lettered) == (0, 0, 0)
    after = spool.get(job.id)
    assert after.state is JobState.CANCELED
    assert after.result is None
    assert job_files(spool.root) == {job.id: ["canceled"]}


def test_a_job_canceled_while_its_handler_fails_is_not_retried(spool: Spool) -> None:
    job = spool.enqueue("work")

    def handler(j: Job, c: Context) -> None:
        spool.cancel(j.id)
        raise RuntimeError("and then it broke")

    report = Worker(spool, {"work": handler}).run_until_idle()
    assert report.lease_lost == 1
    assert report.retried == 0
    after = spool.get(job.id)
    assert after.state is JobState.CANCELED
    assert after.last_error is None or "broke" not in after.last_error


def test_a_job_reclaimed_by_another_spool_after_expiry_keeps_the_other_result(
        spool: Spool, clock: FakeClock, flavor: Any) -> None:
    job = spool.enqueue("work")
    other_tokens: list[int] = []

    def handler(j: Job, c: Context) -> str:
        # This run stalls past its lease; meanwhile another process takes the job over.
        clock.advance(31.0)
        other = make_spool(spool.root, clock=clock)
        try:
            (lease,) = other.claim()
            assert lease.token > c.token
            other_tokens.append(lease.token)
            other.complete(lease, "the other worker's result")
        finally:
            other.close()
        return "stale result"

    report = Worker(spool, {"work": flavor(handler)}).run_until_idle()
    assert report.lease_lost == 1
    assert report.completed == 0
    done = spool.get(job.id)
    assert done.state is JobState.COMPLETED
    assert done.result == "the other worker's result"
    assert done.attempts == 2
    assert job_files(spool.root) == {job.id: ["completed"]}


def test_a_lease_lost_at_a_heartbeat_is_counted_once_and_its_result_discarded(
        make_spool: SpoolFactory) -> None:
    spool = make_spool(lease_seconds=0.6)
    job = spool.enqueue("work")

    def handler(j: Job, c: Context) -> str:
        spool.cancel(j.id)
        time.sleep(0.7)  # at least one beat (every 0.2 s) sees the lease gone
        return "discarded"

    report = Worker(spool, {"work": handler}).run_until_idle()
    assert report.lease_lost == 1
    assert report.completed == 0
    assert spool.get(job.id).state is JobState.CANCELED
    assert spool.get(job.id).result is None


# ---------------------------------------------------------------- the context


def test_context_exposes_the_lease_token_and_job(spool: Spool) -> None:
    spool.enqueue("work")
    seen: list[tuple[int, str, str]] = []

    def handler(j: Job, c: Context) -> None:
        seen.append((c.token, c.job_id, c.job.id))

    Worker(spool, {"work": handler}).run_until_idle()
    ((token, cid, jid),) = seen
    assert token >= 1
    assert cid == jid
    assert spool.fence_value() == token


def test_ctx_heartbeat_keeps_a_stalled_handler_lease_alive(spool: Spool, clock: FakeClock) -> None:
    job = spool.enqueue("work")

    def handler(j: Job, c: Context) -> str:
        clock.advance(20.0)
        c.heartbeat()
        clock.advance(20.0)  # 40 s after the claim, past the 30 s lease, but 20 s after the beat
        return "kept"

    report = Worker(spool, {"work": handler}).run_until_idle()
    assert report.lease_lost == 0
    assert spool.get(job.id).result == "kept"


def test_ctx_fenced_runs_the_block_while_the_lease_is_current(spool: Spool, flavor: Any) -> None:
    job = spool.enqueue("work")
    effects: list[int] = []

    def handler(j: Job, c: Context) -> str:
        with c.fenced() as lease:
            assert lease.token == c.token
            effects.append(lease.token)
        return "done"

    report = Worker(spool, {"work": flavor(handler)}).run_until_idle()
    assert report.completed == 1
    assert len(effects) == 1
    assert spool.get(job.id).state is JobState.COMPLETED


def test_ctx_fenced_refuses_the_block_after_the_lease_was_lost(spool: Spool) -> None:
    job = spool.enqueue("work")
    effects: list[str] = []
    raised: list[BaseException] = []

    def handler(j: Job, c: Context) -> None:
        spool.cancel(j.id)
        try:
            with c.fenced():
                effects.append("side effect after cancel")
        except LeaseLost as exc:
            raised.append(exc)
            raise

    report = Worker(spool, {"work": handler}).run_until_idle()
    assert effects == []
    assert len(raised) == 1
    assert report.lease_lost == 1
    assert spool.get(job.id).state is JobState.CANCELED


def test_ctx_fenced_refuses_the_block_after_the_lease_expired(
        spool: Spool, clock: FakeClock) -> None:
    job = spool.enqueue("work")
    effects: list[int] = []

    def handler(j: Job, c: Context) -> None:
        if j.attempts == 1:
            clock.advance(31.0)  # the first run stalls past its lease
        with c.fenced():
            effects.append(j.attempts)

    report = Worker(spool, {"work": handler}).run_until_idle()
    # The expired lease is claimable again: the same run takes it as attempt 2, which
    # is the only one whose fenced block runs.
    assert effects == [2]
    assert report.lease_lost == 1
    assert report.completed == 1
    assert spool.get(job.id).attempts == 2


# ---------------------------------------------------------------- construction


def test_worker_accepts_an_app(spool: Spool) -> None:
    job = spool.enqueue("work")
    Worker(spool, App(handlers={"work": lambda j, c: "via app"})).run_until_idle()
    assert spool.get(job.id).result == "via app"


@pytest.mark.parametrize("handlers", [{}, None, {"work": 42}])
def test_worker_refuses_missing_or_uncallable_handlers(spool: Spool, handlers: Any) -> None:
    with pytest.raises(JobspoolError):
        Worker(spool, handlers)


@pytest.mark.parametrize("kind", ["bad kind", "../x", ""])
def test_worker_refuses_a_handler_for_an_invalid_kind_when_constructed(
        spool: Spool, kind: str) -> None:
    """Not later, as a crash loop of its claims."""
    with pytest.raises(InvalidJob, match="kind"):
        Worker(spool, {kind: lambda j, c: None})


@pytest.mark.parametrize("kwargs", [{"concurrency": 0}, {"batch_size": 0},
                                    {"lease_seconds": 0}, {"concurrency": 1.5}])
def test_worker_refuses_bad_settings(spool: Spool, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidJob):
        Worker(spool, {"work": lambda j, c: None}, **kwargs)


def test_run_until_idle_refuses_a_negative_max_jobs(spool: Spool) -> None:
    with pytest.raises(InvalidJob):
        Worker(spool, {"work": lambda j, c: None}).run_until_idle(max_jobs=-1)


# ---------------------------------------------------------------- the supervised loop


def test_a_transient_failure_of_the_machinery_is_survived(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    spool.enqueue_many("work", [{"i": i} for i in range(5)])
    real_claim = spool.claim
    failures = [OSError(5, "Input/output error (injected)")]

    def claim(**kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real_claim(**kwargs)

    monkeypatch.setattr(spool, "claim", claim)
    report = Worker(spool, {"work": lambda j, c: None}).run_until_idle()
    assert report.crashes == 1
    assert report.completed == 5


def test_repeated_quick_failures_of_the_machinery_give_up(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    spool.enqueue("work")

    def claim(**kwargs: Any) -> Any:
        raise OSError(5, "Input/output error (injected)")

    monkeypatch.setattr(spool, "claim", claim)
    with pytest.raises(WorkerCrashed):
        Worker(spool, {"work": lambda j, c: None}, max_crashes=3).run_until_idle()


def test_a_failing_heartbeat_does_not_kill_the_worker(
        make_spool: SpoolFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = make_spool(lease_seconds=0.6)
    jobs = spool.enqueue_many("work", [{"i": i} for i in range(2)])
    real = spool.heartbeat_many
    failures = [OSError(5, "Input/output error (injected)")]

    def heartbeat_many(leases: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(leases, **kwargs)

    monkeypatch.setattr(spool, "heartbeat_many", heartbeat_many)

    def handler(j: Job, c: Context) -> str:
        time.sleep(0.35)  # spans the first beat (at 0.2 s)
        return "ok"

    report = Worker(spool, {"work": handler}).run_until_idle()
    assert not failures, "the injected failure was never hit"
    for j in jobs:
        assert spool.get(j.id).state is JobState.COMPLETED
    assert report.completed == 2


def test_a_failure_while_settling_releases_the_batch_instead_of_stranding_it(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = spool.enqueue_many("work", [{"i": i} for i in range(3)])
    real = spool.complete_many
    failures = [OSError(28, "No space left on device (injected)")]

    def complete_many(items: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(items)

    monkeypatch.setattr(spool, "complete_many", complete_many)
    report = Worker(spool, {"work": lambda j, c: "ok"}).run_until_idle()
    assert report.crashes == 1
    # Given back (released), then claimed again and completed on the next cycle.
    assert report.completed == 3
    for j in jobs:
        assert spool.get(j.id).state is JobState.COMPLETED
    assert not list((spool.root / "leased").iterdir())


# ---------------------------------------------------------------- run_forever and stop()


def test_run_forever_returns_after_stop_and_settles_what_ran(spool: Spool) -> None:
    spool.enqueue_many("work", [{"i": i} for i in range(3)])
    worker: Worker

    def handler(j: Job, c: Context) -> int:
        if j.payload["i"] == 2:
            worker.stop()
        return int(j.payload["i"])

    worker = Worker(spool, {"work": handler}, concurrency=1)
    report = anyio.run(functools.partial(worker.run_forever, handle_signals=False,
                                         poll_seconds=0.05))
    assert report.completed == 3
    assert worker.stopping
    assert not list((spool.root / "leased").iterdir())


def test_stop_from_another_thread_releases_jobs_not_yet_started(spool: Spool) -> None:
    spool.enqueue_many("work", [{"i": i} for i in range(6)])
    started = threading.Event()
    worker: Worker

    def handler(j: Job, c: Context) -> None:
        started.set()
        time.sleep(0.3)

    worker = Worker(spool, {"work": handler}, concurrency=1, batch_size=6)
    t = threading.Thread(target=lambda: (started.wait(10), worker.stop()))
    t.start()
    report = anyio.run(functools.partial(worker.run_forever, handle_signals=False))
    t.join()
    assert report.completed >= 1
    assert report.completed + report.released == 6
    states = [j.state for j in spool.jobs()]
    assert JobState.LEASED not in states
    for j in spool.jobs(state="ready"):
        assert j.attempts == 0  # a release does not count the attempt


# ---------------------------------------------------------------- projection


def test_ctx_upsert_writes_rows_into_a_lancedb_table_and_a_lost_run_writes_nothing(
        tmp_path: Path, spool: Spool) -> None:
    """One LanceDB test (the projection has its own suite): rows land, fenced by token,
    and the writes of a run whose job was canceled under it are discarded with its result
    (Context: "a run whose lease was lost has its writes discarded")."""
    from jobspool.projection.lance import LanceProjection

    uri = str(tmp_path / "lance")
    jobs = [spool.enqueue("note", {"id": f"n{i}", "text": f"hello {i}"}) for i in range(3)]
    canceled = spool.enqueue("note", {"id": "gone", "text": "never", "cancel": True})

    def handler(j: Job, c: Context) -> None:
        if j.payload.get("cancel"):
            spool.cancel(j.id)
        c.upsert("notes", {"id": j.payload["id"], "text": j.payload["text"]})

    report = Worker(spool, {"note": handler}, projection=uri, maintenance=False).run_until_idle()
    assert report.completed == 3
    assert report.lease_lost == 1
    table = LanceProjection(uri, "notes")
    try:
        for i, j in enumerate(jobs):
            row = table.get(f"n{i}")
            assert row is not None
            assert row["text"] == f"hello {i}"
            done = spool.get(j.id)
            assert done.state is JobState.COMPLETED
            assert done.attempts == 1
            assert row["fence"] == 1 + jobs.index(j)  # the token of the run that wrote it
        assert spool.get(canceled.id).state is JobState.CANCELED
        assert table.get("gone") is None, "a canceled run's write reached the table"
        assert table.count() == 3
        assert report.projected_rows == 3
    finally:
        table.store.close()


# ---------------------------------------------------------------- pipelining


def test_a_slow_job_does_not_hold_its_quick_batch_mates_hostage(spool: Spool) -> None:
    """Quick jobs claimed with a slow one are settled (completed on disk) while it runs."""
    spool.enqueue("work", {"slow": True}, job_id="slow")
    spool.enqueue_many("work", [{"slow": False} for _ in range(9)])
    seen: dict[str, int] = {}

    def handler(j: Job, c: Context) -> str:
        if j.payload["slow"]:
            deadline = time.monotonic() + 10.0  # a guard against hangs, not a timing claim
            while time.monotonic() < deadline:
                seen["completed_while_slow_ran"] = sum(
                    1 for _ in spool.jobs(state=JobState.COMPLETED))
                if seen["completed_while_slow_ran"] == 9:
                    break
                time.sleep(0.02)
        return "ok"

    report = Worker(spool, {"work": handler}, concurrency=2, batch_size=10).run_until_idle()
    assert seen["completed_while_slow_ran"] == 9
    assert report.completed == 10


def test_a_burst_of_quick_jobs_is_projected_in_one_table_version(tmp_path: Path) -> None:
    """Group commit survives pipelining: one batch of quick jobs, one merge, one version."""
    from jobspool.projection.lance import LanceProjection

    uri = str(tmp_path / "index")
    with make_spool(tmp_path / "s") as spool:
        spool.enqueue("note", {"n": -1})  # creates the table first
        Worker(spool, {"note": _project_note}, projection=uri,
               maintenance=False).run_until_idle()
        before = LanceProjection(uri, "notes").version()
        spool.enqueue_many("note", [{"n": i} for i in range(20)])
        report = Worker(spool, {"note": _project_note}, projection=uri, batch_size=50,
                        concurrency=4, maintenance=False).run_until_idle()
    table = LanceProjection(uri, "notes")
    assert report.completed == 20
    assert table.count() == 21
    assert before is not None and table.version() == before + 1


def _project_note(job: Job, ctx: Context) -> None:
    ctx.upsert("notes", {"id": f"n{job.payload['n']}", "n": job.payload["n"]})


def test_a_worker_asked_for_kinds_it_has_no_handler_for_refuses_to_start(spool: Spool) -> None:
    with pytest.raises(JobspoolError, match="without a handler"):
        Worker(spool, {"work": lambda j, c: None}, kinds=["other"])


def test_a_worker_narrowed_by_kinds_leaves_the_rest_for_others(spool: Spool) -> None:
    spool.enqueue("work")
    spool.enqueue("other")
    report = Worker(spool, {"work": lambda j, c: None, "other": lambda j, c: None},
                    kinds=["work"]).run_until_idle()
    assert report.completed == 1
    assert report.unhandled == {"other": 1}


def test_fail_or_retry_raised_with_none_records_a_readable_reason(spool: Spool) -> None:
    """`Fail(None)` stored 'NoneType: None' as the job's error."""
    spool.enqueue("f", job_id="failed")
    spool.enqueue("r", job_id="retried")

    def f(job: Job, ctx: Context) -> None:
        raise Fail(None)  # type: ignore[arg-type]

    def r(job: Job, ctx: Context) -> None:
        raise Retry(None)  # type: ignore[arg-type]

    Worker(spool, {"f": f, "r": r}).run_until_idle()
    assert spool.get("failed").last_error == "failed permanently"
    assert spool.get("retried").last_error == "Retry: retry requested"


@pytest.mark.parametrize("reason", ["", "   ", "\n"])
def test_fail_with_a_blank_reason_records_a_readable_one(spool: Spool, reason: str) -> None:
    """`Fail("")` dead-lettered the job with an empty error: no reason for an operator."""
    spool.enqueue("f", job_id="failed")

    def f(job: Job, ctx: Context) -> None:
        raise Fail(reason)

    Worker(spool, {"f": f}).run_until_idle()
    job = spool.get("failed")
    assert (job.state, job.last_error) == (JobState.DEAD_LETTER, "failed permanently")
