"""The store contract, worker side (DESIGN §5): `Worker.run_until_idle` over each store with
sync and async handlers, `Retry`, `Fail` and plain exceptions (tests/store_params.py)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobspool import Context, Fail, Job, JobState, Retry, Spool, Worker


def test_worker_runs_sync_and_async_handlers_once_each_and_completes_them(any_spool: Spool) -> None:
    seen: Counter[str] = Counter()
    guard = threading.Lock()

    def sync_handler(job: Job, ctx: Context) -> dict[str, Any]:
        with guard:
            seen[job.id] += 1
        return {"sync": job.payload, "token": ctx.token}

    async def async_handler(job: Job, ctx: Context) -> dict[str, Any]:
        with guard:
            seen[job.id] += 1
        return {"async": job.payload, "token": ctx.token}

    sync_ids = [j.id for j in any_spool.enqueue_many("plain", list(range(30)))]
    async_ids = [j.id for j in any_spool.enqueue_many("coro", list(range(30)))]
    report = Worker(any_spool, {"plain": sync_handler, "coro": async_handler}, concurrency=4,
                    batch_size=8).run_until_idle()
    assert report.completed == 60 and report.claimed == 60
    assert (report.retried, report.dead_lettered, report.lease_lost) == (0, 0, 0)
    assert seen == Counter({i: 1 for i in sync_ids + async_ids})
    tokens = set()
    for ids, key in ((sync_ids, "sync"), (async_ids, "async")):
        for n, job_id in enumerate(ids):
            job = any_spool.get(job_id)
            assert job.state is JobState.COMPLETED and job.attempts == 1
            assert job.result[key] == n
            tokens.add(job.result["token"])
    assert len(tokens) == 60  # one fencing token per run


def test_worker_retries_on_retry_and_completes_the_next_attempt(any_spool: Spool) -> None:
    attempts: Counter[str] = Counter()

    def flaky(job: Job, ctx: Context) -> str:
        attempts[job.id] += 1
        if attempts[job.id] == 1:
            raise Retry("not yet", delay=0.0)
        return "second time"

    any_spool.enqueue("flaky", job_id="j")
    report = Worker(any_spool, {"flaky": flaky}, concurrency=1).run_until_idle(
        wait_for_retries=30.0)
    job = any_spool.get("j")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, "second time", 2)
    assert (report.retried, report.completed) == (1, 1)
    assert attempts["j"] == 2


def test_worker_dead_letters_on_fail_and_on_the_last_attempt_of_an_exception(
        any_spool: Spool) -> None:
    def doomed(job: Job, ctx: Context) -> None:
        raise Fail("bad input 17")

    def broken(job: Job, ctx: Context) -> None:
        raise ValueError("kaput 23")

    any_spool.enqueue("doomed", job_id="d", max_attempts=5)
    any_spool.enqueue("broken", job_id="b", max_attempts=1)
    report = Worker(any_spool, {"doomed": doomed, "broken": broken}, concurrency=2).run_until_idle()
    assert report.dead_lettered == 2 and report.completed == 0
    d, b = any_spool.get("d"), any_spool.get("b")
    assert (d.state, d.attempts) == (JobState.DEAD_LETTER, 1)
    assert d.last_error is not None and "bad input 17" in d.last_error
    assert (b.state, b.attempts) == (JobState.DEAD_LETTER, 1)
    assert b.last_error is not None and "kaput 23" in b.last_error
    assert b.traceback is not None and "ValueError" in b.traceback


def test_a_handler_error_with_a_nul_character_dead_letters_its_job_and_the_run_goes_on(
        any_spool: Spool) -> None:
    def binary(job: Job, ctx: Context) -> None:
        raise ValueError("bytes b'\x00\x01' in the message")

    any_spool.enqueue("binary", job_id="b", max_attempts=1)
    any_spool.enqueue("plain", job_id="p")
    report = Worker(any_spool, {"binary": binary, "plain": lambda job, ctx: "ok"},
                    concurrency=1).run_until_idle()
    assert (report.dead_lettered, report.completed) == (1, 1)
    b = any_spool.get("b")
    assert (b.state, b.attempts) == (JobState.DEAD_LETTER, 1)
    assert b.last_error is not None and "in the message" in b.last_error
    assert any_spool.get("p").state is JobState.COMPLETED


def test_a_result_too_large_dead_letters_that_job_alone(any_spool: Spool) -> None:
    def handler(job: Job, ctx: Context) -> str:
        return "x" * 70_000 if job.id == "big" else "small"

    for job_id in ("a", "big", "b"):
        any_spool.enqueue("sized", job_id=job_id)
    report = Worker(any_spool, {"sized": handler}, batch_size=10).run_until_idle()
    assert (report.completed, report.dead_lettered) == (2, 1)
    assert [any_spool.get(i).result for i in ("a", "b")] == ["small", "small"]
    big = any_spool.get("big")
    assert big.state is JobState.DEAD_LETTER and big.result is None


@pytest.mark.parametrize("bad", ["too large", "not JSON"])
def test_a_result_the_spool_refuses_publishes_none_of_that_jobs_rows(
        any_spool: Spool, tmp_path: Path, bad: str) -> None:
    # Found in the robustness pass: the result was checked at the complete, after the
    # merge, so the job was dead-lettered with its rows published in the table.
    from jobspool import LanceProjection

    def handler(job: Job, ctx: Context) -> object:
        ctx.upsert("t", {"id": job.id, "v": 1}, version=1)
        if job.id != "bad":
            return "small"
        return "x" * 70_000 if bad == "too large" else {1, 2}

    for job_id in ("a", "bad", "b"):
        any_spool.enqueue("sized", job_id=job_id)
    index = tmp_path / "index"
    report = Worker(any_spool, {"sized": handler}, batch_size=10,
                    projection=str(index)).run_until_idle()
    assert (report.completed, report.dead_lettered) == (2, 1)
    dead = any_spool.get("bad")
    assert dead.state is JobState.DEAD_LETTER and "result refused" in (dead.last_error or "")
    table = LanceProjection(str(index), "t")
    assert table.get("bad") is None
    assert [table.get(i)["v"] for i in ("a", "b")] == [1, 1]  # type: ignore[index]


def test_a_job_near_the_size_limit_can_fail_with_a_long_traceback_and_still_complete(
        any_spool: Spool) -> None:
    calls: Counter[str] = Counter()

    def handler(job: Job, ctx: Context) -> str:
        calls[job.id] += 1
        if calls[job.id] == 1:
            raise RuntimeError("boom " * 5_000)  # a long message and traceback, truncated to fit
        return "ok"

    any_spool.enqueue("near", {"blob": "p" * 60_000}, job_id="n", max_attempts=3)
    Worker(any_spool, {"near": handler}).run_until_idle(wait_for_retries=30.0)
    job = any_spool.get("n")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, "ok", 2)
    assert job.payload == {"blob": "p" * 60_000}


@pytest.mark.parametrize(("result_bytes", "completes"), [(1_500, True), (2_200, False)])
def test_an_earlier_runs_error_gives_way_to_a_result_that_fits(
        any_spool: Spool, spool_store: str, result_bytes: int, completes: bool) -> None:
    """A job admitted at the limit whose first run failed (error and traceback cut to fill
    the room left) completes with a result that fits beside its payload, the old error cut
    further; it completed over max_job_bytes. A result that does not fit dead-letters it."""
    from jobspool.queue.job import encode_job
    from jobspool.queue.jobsize import admission_limit

    limit = any_spool.max_job_bytes
    size = len(encode_job(any_spool.enqueue("near", "", job_id="n"), max_bytes=limit))
    # A few bytes short of the limit: the replacing enqueue's times may print longer.
    any_spool.enqueue("near", "x" * (admission_limit(limit) - size - 24), job_id="n",
                      on_conflict="replace")
    runs: Counter[str] = Counter()

    def handler(job: Job, ctx: Context) -> str:
        runs[job.id] += 1
        if runs[job.id] == 1:
            raise ValueError("e" * 5_000)
        return "r" * result_bytes

    Worker(any_spool, {"near": handler}, owner="w-" + "o" * 100).run_until_idle(
        wait_for_retries=30.0)
    job = any_spool.get("n")
    assert runs["n"] == 2
    assert len(encode_job(job, max_bytes=10 * limit)) <= limit
    if completes:
        assert (job.state, job.result) == (JobState.COMPLETED, "r" * result_bytes)
        assert (job.last_error or "").startswith("ValueError: eee")
    else:
        assert job.state is JobState.DEAD_LETTER and "result refused" in (job.last_error or "")
    if spool_store == "file":
        on_disk = [p.stat().st_size for p in any_spool.root.glob("*/n.json")]
        assert len(on_disk) == 1 and on_disk[0] <= limit


_FENCED_CHILD = """
import sys, time
from jobspool import Spool, Worker
mode = sys.argv[2]
with Spool(sys.argv[1]) as spool:
    def handler(job, ctx):
        with ctx.fenced():
            time.sleep(0.05)
            if mode == "heartbeat":
                ctx.heartbeat()  # a long side effect keeps its lease from inside the block
            elif mode == "nested":  # a helper that fences its own write, called in a block
                with ctx.fenced():
                    spool.enqueue("child", job_id="c-" + job.id)
            else:
                spool.enqueue("child", job_id="c-" + job.id)  # the outbox pattern
        return "ok"
    report = Worker(spool, {"fenced": handler}, concurrency=24, batch_size=24).run_until_idle()
    print(report.completed, flush=True)
"""


# "nested": found probing the handler runtime; on PostgreSQL the inner block took a pooled
# connection of its own and waited forever on the row lock of its outer transaction.
@pytest.mark.parametrize(("mode", "jobs"), [("heartbeat", 1), ("enqueue", 60), ("nested", 8)])
def test_work_inside_fenced_blocks_neither_deadlocks_nor_fails(
        any_spool: Spool, store_root: object, mode: str, jobs: int) -> None:
    """`ctx.heartbeat()`, or an enqueue, from inside `ctx.fenced()`, with more handlers in
    fenced blocks at once than a store might have connections."""
    import subprocess
    import sys

    from tests.subproc import REPO, cli_env

    ids = [j.id for j in any_spool.enqueue_many("fenced", [None] * jobs)]
    # In a child: a deadlock must fail this test, not hang the suite.
    proc = subprocess.Popen([sys.executable, "-c", _FENCED_CHILD, str(store_root), mode],
                            cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the worker hung ({mode} inside ctx.fenced())")
    assert proc.returncode == 0, err.decode(errors="replace")
    assert out.decode().split() == [str(jobs)]
    assert {any_spool.get(i).state for i in ids} == {JobState.COMPLETED}
    if mode in ("enqueue", "nested"):
        assert sorted(j.id for j in any_spool.jobs(kind="child")) == sorted(f"c-{i}" for i in ids)


def test_a_fenced_block_that_outlives_its_lease_keeps_the_job(any_spool: Spool) -> None:
    # Found in the robustness pass: nothing could take the job while the block held it,
    # yet its exit raised LeaseLost (the lease had expired meanwhile), so a side effect
    # already done was reported lost and the job ran again, side effect and all.
    import time

    from jobspool.queue.context import Context as RunContext

    any_spool.enqueue("k", job_id="j")
    (lease,) = any_spool.claim(lease_seconds=0.2)
    ctx = RunContext(any_spool, lease)
    with ctx.fenced():
        time.sleep(0.4)  # past the lease: the block's own doing, not another worker's
    job = any_spool.get("j")
    assert job.state is JobState.LEASED and job.lease is not None
    assert job.lease.token == lease.token and job.lease.expires_at > time.time()
    assert any_spool.complete(lease, "done").state is JobState.COMPLETED


def test_async_handlers_cannot_interleave_fenced_blocks(any_spool: Spool) -> None:
    # Found in the robustness pass: the spool lock is re-entrant per thread, so an async
    # handler's block entered while another's awaited ran beside it, not after it.
    import anyio

    entered = anyio.Event()
    refused: list[str] = []

    async def holder(job: Job, ctx: Context) -> str:
        with ctx.fenced():
            entered.set()
            for _ in range(200):  # until the other handler has tried (bounded)
                if refused:
                    break
                await anyio.sleep(0.01)
        return "held"

    async def intruder(job: Job, ctx: Context) -> str:
        await entered.wait()
        try:
            with ctx.fenced():
                pass
        except RuntimeError as exc:
            refused.append(str(exc))
            raise
        return "entered"

    any_spool.enqueue("holder", job_id="h", max_attempts=1)
    any_spool.enqueue("intruder", job_id="i", max_attempts=1)
    Worker(any_spool, {"holder": holder, "intruder": intruder}, concurrency=2,
           batch_size=2).run_until_idle(wait_for_retries=5)
    assert len(refused) == 1 and "its handler awaited inside it" in refused[0], refused
    # The handler that awaited inside its block fails; the one refused meanwhile is given
    # back uncounted and runs again (it was dead-lettered, and the rule-breaker completed).
    held = any_spool.get("h")
    assert held.state is JobState.DEAD_LETTER, held
    assert "awaited inside its fenced block" in (held.last_error or "")
    intruder_job = any_spool.get("i")
    assert intruder_job.state is JobState.COMPLETED and intruder_job.result == "entered"


def test_a_lost_lease_of_another_job_is_the_handlers_failure_not_its_own(
        any_spool: Spool) -> None:
    # Found probing the handler runtime: a handler settling a child job it claimed let the
    # child's LeaseLost escape, and the worker took it for the parent's own lost lease: the
    # parent stayed leased until expiry, its error recorded nowhere, counted `lease_lost`.
    any_spool.enqueue("child", job_id="child")
    any_spool.enqueue("parent", job_id="parent", max_attempts=3)

    def parent(job: Job, ctx: Context) -> str:
        (lease,) = any_spool.claim(kinds=["child"])
        any_spool.cancel(lease.job_id)  # an operator cancels the child meanwhile
        any_spool.complete(lease)  # LeaseLost for the child's lease, not the parent's
        return "unreachable"

    report = Worker(any_spool, {"parent": parent}).run_until_idle()
    assert (report.retried, report.lease_lost) == (1, 0)
    job = any_spool.get("parent")
    assert job.state is JobState.RETRYABLE and job.lease is None and job.attempts == 1
    assert job.last_error is not None and "LeaseLost" in job.last_error
    assert "'child'" in job.last_error


def test_a_handler_whose_own_lease_is_lost_is_still_counted_lost(any_spool: Spool) -> None:
    any_spool.enqueue("k", job_id="j")

    def handler(job: Job, ctx: Context) -> str:
        any_spool.cancel(job.id)
        ctx.heartbeat()  # its own lease: LeaseLost, and the run is discarded
        return "unreachable"

    report = Worker(any_spool, {"k": handler}).run_until_idle()
    assert (report.lease_lost, report.retried, report.completed) == (1, 0, 0)
    assert any_spool.get("j").state is JobState.CANCELED


def test_worker_leaves_kinds_it_has_no_handler_for(any_spool: Spool) -> None:
    any_spool.enqueue("mine", job_id="m")
    any_spool.enqueue("theirs", job_id="t")
    Worker(any_spool, {"mine": lambda job, ctx: "ok"}, kinds=["mine"]).run_until_idle()
    assert any_spool.get("m").state is JobState.COMPLETED
    assert any_spool.get("t").state is JobState.READY


def test_async_spool_enqueues_prepares_and_waits_on_either_store(store_root: object,
                                                                 any_spool: Spool) -> None:
    import anyio

    from jobspool import AsyncSpool

    async def main() -> tuple[Job, Job]:
        async with AsyncSpool(store_root) as aspool:  # type: ignore[arg-type]
            job = await aspool.enqueue("plain", {"n": 1}, job_id="a1")
            assert (await aspool.get("a1")) == job
            r = await aspool.prepare("plain", {"n": 2}, job_id="a2")
            assert (await aspool.commit(r)).state is JobState.READY
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(anyio.to_thread.run_sync, lambda: Worker(
                        any_spool, {"plain": lambda job, ctx: job.payload["n"] * 10}).run_until_idle())
                    done = await aspool.wait("a1", timeout=60)
            return done, await aspool.get("a2")

    first, second = anyio.run(main)
    assert (first.state, first.result) == (JobState.COMPLETED, 10)
    assert (second.state, second.result) == (JobState.COMPLETED, 20)


@pytest.mark.parametrize("rescued_first", [True, False], ids=["rescued-first", "mates-first"])
def test_a_rescued_job_runs_alone_after_the_mates_claimed_with_it(
        any_spool: Spool, rescued_first: bool) -> None:
    # Found in CI: a job whose worker died runs alone, so it took every slot at once and
    # went ahead of the jobs claimed in its batch; with one slot they waited, leased and
    # unstarted, for all of its run (a 10-minute one held them 10 minutes). It also went
    # on claiming while the rescued job ran, so more jobs waited behind it.
    from jobspool.queue.machine import Failure, RetryPolicy

    any_spool.enqueue("slow", job_id="r", priority=-1 if rescued_first else 1)
    [lease] = any_spool.claim(limit=1)
    any_spool.fail(lease, Failure(error="worker process died", rescued=True,
                                  policy=RetryPolicy(base_seconds=0, max_seconds=0)))
    assert any_spool.get("r").rescues == 1
    mates = [j.id for j in any_spool.enqueue_many("quick", [{} for _ in range(5)])]
    ran: list[str] = []
    seen_at_start: list[list[str]] = []
    late_state: list[JobState] = []

    def quick(job: Job, ctx: Context) -> None:
        ran.append(job.id)

    def slow(job: Job, ctx: Context) -> None:
        seen_at_start.append(list(ran))
        # Enqueued while it runs alone: this worker must leave it for others meanwhile.
        late = any_spool.enqueue("quick", job_id="late")
        for _ in range(20):  # twenty of the loop's turns at least: time enough to claim
            threading.Event().wait(0.02)
        late_state.append(any_spool.get(late.id).state)

    report = Worker(any_spool, {"quick": quick, "slow": slow}, concurrency=1,
                    batch_size=20).run_until_idle()
    assert [sorted(s) for s in seen_at_start] == [sorted(mates)]
    assert late_state == [JobState.READY]
    assert report.completed == 7 and report.claimed == 7
    assert any_spool.get("late").state is JobState.COMPLETED


def test_a_retry_that_comes_due_while_the_run_looks_for_the_next_one_is_not_left_behind(
        any_spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_until_idle(wait_for_retries=…)` ended with a retry still waiting when it came
    due between the run's empty claim and its look for the next due job (that look names
    only what comes due later): about 1 run in 25 on a loaded machine. The look is slowed
    here past the retry's delay, so the window is always hit."""
    import time

    spool = any_spool
    job = spool.enqueue("work")
    looked = spool.next_due_at

    def slow_look(kinds: Any = None) -> float | None:
        time.sleep(0.1)
        return looked(kinds)

    monkeypatch.setattr(spool, "next_due_at", slow_look)

    def handler(j: Job, c: Context) -> str:
        if j.attempts == 1:
            raise Retry("soon", delay=0.02)
        return "second"

    report = Worker(spool, {"work": handler}).run_until_idle(wait_for_retries=5.0)
    assert (report.retried, report.completed) == (1, 1)
    assert spool.get(job.id).state is JobState.COMPLETED
