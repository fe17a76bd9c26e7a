"""Per-kind policies (DESIGN §9): time limits, attempts, backoff and which errors retry.

A run past its kind's `timeout` fails with `TimeLimitExceeded` and the retry
rules apply; an async handler is cancelled, a sync one (a thread cannot be
stopped) is abandoned and its lease given up. Bad policies are refused when
the app or worker is built, with one line naming the bad value.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from typing import Any

import anyio
import pytest

from jobspool import App, Context, Job, JobState, Policy, Spool, Worker
from jobspool.errors import JobspoolError, PolicyError, TimeLimitExceeded
from tests.helpers_spool import FakeClock
from tests.spools import make_spool


async def _swallows(job: Job, ctx: Context) -> str:
    """Catches its cancellation (its time limit's) and returns."""
    try:
        await anyio.sleep(30)
    except anyio.get_cancelled_exc_class():
        return "swallowed"
    return "slept"


def _worker(spool: Spool, handlers: dict[str, Any], policies: dict[str, Policy],
            **options: Any) -> Worker:
    return Worker(spool, handlers, policies=policies, maintenance=False, **options)


def test_an_async_handler_past_its_timeout_is_cancelled_and_fails_with_time_limit_exceeded(
        spool: Spool) -> None:
    cancelled = threading.Event()

    async def hang(job: Job, ctx: Context) -> None:
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    job = spool.enqueue("hang")
    report = _worker(spool, {"hang": hang}, {"hang": Policy(timeout=0.2, max_attempts=1)}
                     ).run_until_idle()
    assert cancelled.is_set()
    done = spool.get(job.id)
    assert done.state is JobState.DEAD_LETTER
    assert "TimeLimitExceeded" in (done.last_error or "")
    assert "time limit of 0.2 s" in (done.last_error or "")
    assert report.dead_lettered == 1 and report.completed == 0
    assert report.timed_out == 1 and report.to_dict()["timed_out"] == 1


def test_a_timed_out_run_is_retried_while_attempts_remain(spool: Spool, clock: FakeClock
                                                          ) -> None:
    async def hang(job: Job, ctx: Context) -> None:
        await anyio.sleep(60)

    job = spool.enqueue("hang")
    report = _worker(spool, {"hang": hang}, {"hang": Policy(timeout=0.1, max_attempts=3)}
                     ).run_until_idle()
    assert report.retried == 1
    again = spool.get(job.id)
    assert again.state is JobState.RETRYABLE and again.attempts == 1
    assert "TimeLimitExceeded" in (again.last_error or "")


def test_a_sync_handler_past_its_timeout_is_abandoned_logged_as_hung_and_its_job_failed(
        spool: Spool, caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    finished = threading.Event()

    def stuck(job: Job, ctx: Context) -> str:
        ctx.upsert("notes", {"id": job.id})
        release.wait(30)
        finished.set()
        return "too late"

    job = spool.enqueue("stuck")
    caplog.set_level(logging.WARNING, logger="jobspool")
    try:
        report = _worker(spool, {"stuck": stuck}, {"stuck": Policy(timeout=0.2, max_attempts=1)}
                         ).run_until_idle()
    finally:
        release.set()
    assert not finished.is_set() or report.completed == 0  # returned before the thread did
    done = spool.get(job.id)
    assert done.state is JobState.DEAD_LETTER
    assert "TimeLimitExceeded" in (done.last_error or "")
    assert "cannot be stopped" in (done.last_error or "")
    # Where the thread was when time ran out is the stored traceback.
    assert "release.wait(30)" in (done.traceback or "")
    assert (done.traceback or "").splitlines()[1].startswith(f'  File "{__file__}"')
    hung = [r for r in caplog.records if "ran past its time limit" in str(r.msg)]
    assert len(hung) == 1
    assert hung[0].__dict__["job_id"] == job.id and hung[0].__dict__["kind"] == "stuck"
    assert report.projected_rows == 0  # its write never reached a table


def test_retry_on_dead_letters_other_exceptions_at_once(spool: Spool) -> None:
    def flaky_io(job: Job, ctx: Context) -> None:
        if job.payload == "io":
            raise OSError("disk hiccup")
        raise ValueError("a bug, not worth retrying")

    io_job = spool.enqueue("t", "io")
    bug_job = spool.enqueue("t", "bug")
    _worker(spool, {"t": flaky_io}, {"t": Policy(retry_on=(OSError, TimeoutError))}
            ).run_until_idle()
    assert spool.get(io_job.id).state is JobState.RETRYABLE
    bug = spool.get(bug_job.id)
    assert bug.state is JobState.DEAD_LETTER and bug.attempts == 1
    assert "ValueError: a bug" in (bug.last_error or "")


def test_a_kinds_max_attempts_and_backoff_override_the_spools(spool: Spool,
                                                               clock: FakeClock) -> None:
    def fails(job: Job, ctx: Context) -> None:
        raise RuntimeError("nope")

    slow = spool.enqueue("slow_backoff")
    once = spool.enqueue("once")
    _worker(spool, {"slow_backoff": fails, "once": fails},
            {"slow_backoff": Policy(retry_base_seconds=1000.0, retry_max_seconds=1000.0),
             "once": Policy(max_attempts=1)}).run_until_idle()
    waiting = spool.get(slow.id)
    assert waiting.state is JobState.RETRYABLE
    assert 500.0 <= waiting.run_at - clock.now <= 1000.0  # equal jitter in [d/2, d]
    assert spool.get(once.id).state is JobState.DEAD_LETTER
    assert spool.get(once.id).max_attempts == 1  # the limit the policy applied, shown


def test_a_kind_without_a_timeout_runs_as_long_as_it_needs(spool: Spool) -> None:
    def nap(job: Job, ctx: Context) -> str:
        time.sleep(0.3)
        return "rested"

    job = spool.enqueue("nap")
    _worker(spool, {"nap": nap}, {"nap": Policy(max_attempts=2)}).run_until_idle()
    assert spool.get(job.id).result == "rested"


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "5", True])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(bad: object) -> None:
    with pytest.raises(PolicyError, match="timeout") as err:
        Policy(timeout=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, JobspoolError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("options", [
    {"max_attempts": 0}, {"retry_base_seconds": -1}, {"retry_max_seconds": float("nan")},
    {"retry_on": (ValueError, "OSError")}, {"retry_on": 3},
    {"retry_base_seconds": 10.0, "retry_max_seconds": 1.0},
])
def test_malformed_policies_are_refused_with_one_line(options: dict[str, Any]) -> None:
    with pytest.raises(PolicyError) as err:
        Policy(**options)
    assert "\n" not in str(err.value)


def test_a_policy_for_an_unknown_kind_is_refused_by_app_and_worker(spool: Spool) -> None:
    def work(job: Job, ctx: Context) -> None:
        return None

    with pytest.raises(JobspoolError, match="'nosuch'"):
        App(handlers={"work": work}, policies={"nosuch": Policy(timeout=1.0)})
    with pytest.raises(JobspoolError, match="'nosuch'"):
        Worker(spool, {"work": work}, policies={"nosuch": Policy(timeout=1.0)})
    with pytest.raises(JobspoolError, match=r"must be a jobspool\.Policy"):
        Worker(spool, {"work": work}, policies={"work": {"timeout": 1.0}})  # type: ignore[dict-item]


def test_an_apps_policies_reach_its_worker(spool: Spool) -> None:
    async def hang(job: Job, ctx: Context) -> None:
        await anyio.sleep(60)

    app = App(handlers={"hang": hang}, policies={"hang": Policy(timeout=0.1, max_attempts=1)})
    job = spool.enqueue("hang")
    Worker(spool, app, maintenance=False).run_until_idle()
    assert spool.get(job.id).state is JobState.DEAD_LETTER


def test_time_limit_exceeded_is_a_jobspool_error_that_pickles() -> None:
    err = TimeLimitExceeded("j1", "index", 2.5, "the handler was cancelled")
    assert isinstance(err, JobspoolError)
    back = pickle.loads(pickle.dumps(err))
    assert (back.job_id, back.kind, back.timeout) == ("j1", "index", 2.5)
    assert str(back) == str(err)


def test_time_limits_hold_on_a_real_clock_spool(spool_root: Any) -> None:
    # A real-clock spool: leases and time limits on the same clock as the worker's.
    with make_spool(spool_root, lease_seconds=5.0) as s:
        async def hang(job: Job, ctx: Context) -> None:
            await anyio.sleep(60)

        job = s.enqueue("hang")
        _worker(s, {"hang": hang}, {"hang": Policy(timeout=0.1, max_attempts=1)}
                ).run_until_idle()
        assert s.get(job.id).state is JobState.DEAD_LETTER


def test_a_jobs_own_timeout_overrides_its_kinds_policy(spool: Spool) -> None:
    async def slow(job: Job, ctx: Context) -> str:
        await anyio.sleep(job.payload)
        return "done"

    short = spool.enqueue("slow", 5, timeout=0.2, max_attempts=1)
    relaxed = spool.enqueue("slow", 0.3, timeout=30)
    assert spool.get(short.id).timeout == 0.2  # stored in the job file
    report = _worker(spool, {"slow": slow}, {"slow": Policy(timeout=0.25)}).run_until_idle()
    assert spool.get(short.id).state is JobState.DEAD_LETTER
    assert "TimeLimitExceeded" in (spool.get(short.id).last_error or "")
    assert spool.get(relaxed.id).state is JobState.COMPLETED  # 0.3 s > the kind's 0.25 s
    assert report.timed_out == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "5"])
def test_a_jobs_timeout_must_be_a_positive_finite_number(spool: Spool, bad: object) -> None:
    from jobspool.errors import InvalidJob

    with pytest.raises(InvalidJob, match="timeout"):
        spool.enqueue("slow", timeout=bad)  # type: ignore[arg-type]
    assert list(spool.jobs()) == []


def test_a_sync_job_whose_limit_passes_before_it_starts_is_given_back_not_failed(
        tmp_path: Any) -> None:
    """An async handler blocking the event loop (time.sleep) held back a sync job of a kind
    with a time limit: the limit passed before its thread took it, and it was failed as
    "abandoned, still running" (dead-lettered on its last attempt) though its handler was
    never called. Now it goes back uncounted and runs once the loop is free."""
    calls: list[str] = []

    async def blocker(job: Job, ctx: Context) -> None:
        time.sleep(0.8)  # blocks the loop: what the README tells handlers not to do

    def fast(job: Job, ctx: Context) -> str:
        calls.append(job.id)
        return "ok"

    with make_spool(tmp_path / "s") as spool:
        spool.enqueue("blocker", job_id="blk")
        spool.enqueue("fast", job_id="fast", max_attempts=1)
        report = _worker(spool, {"blocker": blocker, "fast": fast},
                         {"fast": Policy(timeout=0.3)}, concurrency=4,
                         batch_size=4).run_until_idle()
        assert calls == ["fast"]  # run once, when the loop was free
        assert spool.get("fast").state is JobState.COMPLETED
        assert report.timed_out == 0 and report.dead_lettered == 0


@pytest.mark.parametrize("first", ["fast", "blocker"])
def test_an_async_job_held_back_by_another_blocking_the_loop_keeps_its_result(
        tmp_path: Any, first: str) -> None:
    """Found in a projection probe: an async job of a kind with a time limit that returned
    at once (or only started after another async handler had blocked the loop for 1 s)
    was failed as "having blocked the event loop" and dead-lettered, its writes discarded,
    while the handler that blocked the loop was not charged. Now each is judged by its own
    run: the one that blocked past its limit fails, the other completes."""
    async def blocker(job: Job, ctx: Context) -> str:
        time.sleep(1.0)  # blocks the loop: what the README tells handlers not to do
        return "late"

    async def fast(job: Job, ctx: Context) -> str:
        return "ok"

    order = [first, "fast" if first == "blocker" else "blocker"]
    with make_spool(tmp_path / "s") as spool:
        for kind in order:
            spool.enqueue(kind, job_id=kind, max_attempts=1)
        _worker(spool, {"blocker": blocker, "fast": fast},
                {"fast": Policy(timeout=0.3), "blocker": Policy(timeout=0.3)},
                concurrency=2, batch_size=2).run_until_idle()
        done, blocked = spool.get("fast"), spool.get("blocker")
    assert done.state is JobState.COMPLETED and done.result == "ok", done.last_error
    assert blocked.state is JobState.DEAD_LETTER
    assert "TimeLimitExceeded" in (blocked.last_error or "")


def test_an_async_handler_that_swallows_its_cancellation_is_told_so_not_blamed_for_the_loop(
        tmp_path: Any) -> None:
    # A policy probe: one that caught its cancellation and returned was failed as having
    # "blocked the event loop"; one that really blocked it still is.
    async def blocks(job: Job, ctx: Context) -> str:
        time.sleep(0.6)  # no await: the loop is held
        return "blocked"

    with make_spool(tmp_path / "s") as spool:
        spool.enqueue("swallows", {}, job_id="s", max_attempts=1)
        spool.enqueue("blocks", {}, job_id="b", max_attempts=1)
        Worker(spool, {"swallows": _swallows, "blocks": blocks}, maintenance=False,
               policies={"swallows": Policy(timeout=0.2), "blocks": Policy(timeout=0.2)},
               ).run_until_idle()
        swallowed, blocked = spool.get("s"), spool.get("b")
    assert swallowed.state is JobState.DEAD_LETTER and blocked.state is JobState.DEAD_LETTER
    assert swallowed.last_error is not None and blocked.last_error is not None
    assert "caught its cancellation and returned anyway" in swallowed.last_error
    assert "blocked the event loop" not in swallowed.last_error
    assert "having blocked the event loop" in blocked.last_error


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("first", ["swallows", "blocks"])
def test_a_handler_that_returns_on_its_cancellation_after_a_held_loop_is_failed(
        tmp_path: Any, backend: str, first: str) -> None:
    """Found in a policy probe, on trio: a handler that began only after another had
    held the loop got its limit moved to just past the hold; cancelled there, it caught
    the cancellation and returned. Its own run (0.1 s) was within its limit, so its
    result was taken and the job completed. A run that ends on its cancellation is cut
    off, however short it was."""
    async def blocks(job: Job, ctx: Context) -> str:
        time.sleep(1.0)  # no await: the loop is held
        return "blocked"

    second = "blocks" if first == "swallows" else "swallows"
    with make_spool(tmp_path / "s") as spool:
        for kind in (first, second):
            spool.enqueue(kind, {}, job_id=kind, max_attempts=1)
        worker = _worker(spool, {"swallows": _swallows, "blocks": blocks},
                         {"swallows": Policy(timeout=0.3), "blocks": Policy(timeout=0.3)},
                         concurrency=2, batch_size=2)
        anyio.run(worker.arun_until_idle, backend=backend)
        swallowed = spool.get("swallows")
    assert swallowed.state is JobState.DEAD_LETTER, (swallowed.state, swallowed.result)
    assert swallowed.result is None
    assert "caught its cancellation and returned anyway" in (swallowed.last_error or "")
    assert "blocked the event loop" not in (swallowed.last_error or "")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_lone_handler_that_swallows_its_cancellation_is_told_so_on_either_loop(
        tmp_path: Any, backend: str) -> None:
    """Found in a policy probe: on trio, a handler that caught its cancellation and
    returned was said to have "blocked the event loop", which it never did."""
    with make_spool(tmp_path / "s") as spool:
        spool.enqueue("swallows", {}, job_id="s", max_attempts=1)
        worker = _worker(spool, {"swallows": _swallows}, {"swallows": Policy(timeout=0.2)})
        anyio.run(worker.arun_until_idle, backend=backend)
        job = spool.get("s")
    assert job.state is JobState.DEAD_LETTER and job.result is None
    assert "caught its cancellation and returned anyway" in (job.last_error or ""), job.last_error
    assert "blocked the event loop" not in (job.last_error or "")


def test_a_sync_handler_that_began_as_the_loops_limit_passed_gets_its_own_limit() -> None:
    # Seen in a CI run under load: the loop's limit for a quick sync job passed just as
    # its thread began (the loop held up by another handler); judged at once it had not
    # returned yet, and was dead-lettered as "abandoned, still running".
    import threading

    import anyio

    from jobspool.queue.invoke import _StartGate

    gate = _StartGate()
    began = threading.Event()

    def handler(job: Any, ctx: Any) -> str:
        began.set()
        time.sleep(0.2)  # well within its own limit of 2 s
        return "ok"

    class _Ctx:
        job, job_id, in_thread, returned, spool = None, "j", False, False, None

    thread = threading.Thread(target=gate.run, args=(handler, _Ctx()))
    thread.start()
    assert began.wait(60)
    assert not gate.drop()  # it began: not given back
    assert not gate.ended_within(2.0)  # judged now, it has not returned yet
    anyio.run(gate.own_limit, 2.0)
    thread.join()
    assert gate.ended_within(2.0) and gate.result == "ok"
