"""The store contract (DESIGN §3–§5, §9): one suite of public-API behaviors, run against the
file spool and the PostgreSQL store alike (`any_spool`/`make_any_spool`, tests/store_params.py).

Everything here runs on the real clock (the PostgreSQL store reads the database's), so time
only moves forward: delays and leases are short, and waits are readiness polls.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from jobspool import JobState, Spool
from jobspool.errors import (
    DuplicateJob,
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    JobTooLarge,
    LeaseLost,
)
from tests.helpers_spool import STATE_DIRS, stat_counts
from tests.store_params import sleep_past
from tests.waiting import wait_until

MakeSpool = Callable[..., Spool]
PAYLOAD = {"s": "héllo ✓", "n": 7, "f": 2.5, "l": [1, None, True, "x"], "d": {"a": {}}}


def _stale_lease_on(spool: Spool, job_id: str) -> tuple[Any, Any]:
    """(stale, current): a lease from before a cancel + requeue, and the job's current lease."""
    (stale,) = spool.claim()
    spool.cancel(job_id)
    spool.requeue(job_id)
    (current,) = spool.claim()
    assert current.job_id == job_id
    return stale, current


# ---------------------------------------------------------------- enqueue and get


def test_enqueue_then_get_round_trips_every_job_field(any_spool: Spool) -> None:
    before = time.time()
    job = any_spool.enqueue("tasks.add", PAYLOAD, job_id="j1", priority=3, max_attempts=4,
                            timeout=12.5)
    after = time.time()
    assert (job.id, job.kind, job.payload) == ("j1", "tasks.add", PAYLOAD)
    assert job.state is JobState.READY
    assert (job.priority, job.attempts, job.max_attempts) == (3, 0, 4)
    assert job.timeout == 12.5
    assert job.revision >= 1
    assert before - 1 <= job.created_at <= after + 1
    assert job.updated_at >= job.created_at
    assert job.run_at <= after + 1
    assert (job.lease, job.last_error, job.result, job.traceback) == (None, None, None, None)
    assert job.reservations == () and job.rescues == 0
    assert any_spool.get("j1") == job

    (lease,) = any_spool.claim(owner="w-1")
    assert lease.job == any_spool.get("j1")
    assert lease.job.lease is not None
    assert (lease.job.lease.token, lease.job.lease.owner) == (lease.token, "w-1")
    assert lease.job.lease.expires_at == pytest.approx(lease.expires_at)
    assert lease.job.attempts == 1 and lease.job.revision > job.revision

    done = any_spool.complete(lease, {"rows": [1, 2], "ok": True})
    assert done.state is JobState.COMPLETED
    assert done.result == {"rows": [1, 2], "ok": True}
    assert done.lease is None and done.payload == PAYLOAD
    assert any_spool.get("j1") == done


def test_a_failed_attempt_keeps_its_error_on_the_job(any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="j")
    (lease,) = any_spool.claim()
    failed = any_spool.fail(lease, ValueError("bad value 42"))
    assert failed.state is JobState.RETRYABLE
    assert failed.last_error is not None and "bad value 42" in failed.last_error
    assert any_spool.get("j") == failed


def test_generated_ids_are_unique_and_in_creation_order(any_spool: Spool) -> None:
    ids = [any_spool.enqueue("note", i).id for i in range(40)]
    ids += [j.id for j in any_spool.enqueue_many("note", list(range(40)))]
    assert len(set(ids)) == 80
    assert ids == sorted(ids)
    assert [x.job_id for x in any_spool.claim(limit=100)] == ids


def test_a_second_spool_on_the_same_root_sees_and_fences_the_same_jobs(
        make_any_spool: MakeSpool) -> None:
    a, b = make_any_spool(), make_any_spool()
    a.enqueue("note", {"v": 1}, job_id="shared")
    assert b.get("shared") == a.get("shared")
    (lease,) = b.claim()
    assert a.claim() == []
    assert a.get("shared").state is JobState.LEASED
    b.complete(lease, "ok")
    assert a.get("shared").result == "ok"


def test_get_cancel_requeue_and_wait_of_an_unknown_id_raise_job_not_found(
        any_spool: Spool) -> None:
    for call in (any_spool.get, any_spool.cancel, any_spool.requeue):
        with pytest.raises(JobNotFound) as info:
            call("ghost")
        assert info.value.job_id == "ghost"
    with pytest.raises(JobNotFound):
        any_spool.wait("ghost", timeout=0.2)


@pytest.mark.parametrize("bad", [
    {"kind": "9kind"}, {"kind": "a b"}, {"kind": ""}, {"kind": "k/../x"},
    {"job_id": "../x"}, {"job_id": "a/b"}, {"job_id": ""}, {"job_id": "a\x00b"},
    {"job_id": "z" * 130}, {"delay": math.nan}, {"delay": math.inf}, {"delay": -1.0},
    {"payload": {"x": math.nan}}, {"payload": [math.inf]}, {"payload": {1, 2}},
    {"run_at": math.nan}, {"priority": 1.5}, {"max_attempts": 0},
    {"on_conflict": "merge"},
], ids=repr)
def test_bad_input_raises_invalid_job_and_writes_nothing(any_spool: Spool,
                                                         bad: dict[str, Any]) -> None:
    args: dict[str, Any] = {"kind": "note", "payload": None, "job_id": "ok", **bad}
    kind, payload = args.pop("kind"), args.pop("payload")
    with pytest.raises(InvalidJob):
        any_spool.enqueue(kind, payload, **args)
    with pytest.raises(InvalidJob):
        any_spool.enqueue_many(kind, [payload, payload],
                               job_ids=[args.pop("job_id"), "ok2"], **args)
    assert list(any_spool.jobs()) == []


def test_a_payload_over_max_job_bytes_raises_job_too_large_and_writes_nothing(
        any_spool: Spool) -> None:
    with pytest.raises(JobTooLarge):
        any_spool.enqueue("note", "x" * 70_000, job_id="big")
    with pytest.raises(JobTooLarge):
        any_spool.prepare("note", {"blob": "x" * 70_000})
    assert list(any_spool.jobs()) == []


def test_a_result_too_large_dead_letters_its_job_and_says_so(any_spool: Spool) -> None:
    """DESIGN §9, sizes: only a result that does not fit dead-letters that job (run again,
    it would make the same result); the caller is told why, and the error is kept."""
    any_spool.enqueue("note", job_id="j")
    (lease,) = any_spool.claim()
    with pytest.raises(JobTooLarge, match="dead-lettered"):
        any_spool.complete(lease, "x" * 70_000)
    job = any_spool.get("j")
    assert job.state is JobState.DEAD_LETTER and job.result is None
    assert job.last_error is not None and job.last_error.startswith("result refused:")
    assert "max_job_bytes" in job.last_error
    with pytest.raises(LeaseLost):  # settled: the lease can change nothing any more
        any_spool.complete(lease, "small")
    assert any_spool.requeue("j").state is JobState.READY  # and it can run again


@pytest.mark.parametrize(("field", "value"), [
    ("priority", 2**31), ("priority", -(2**40)), ("priority", 2**62),
    ("max_attempts", 2**31), ("max_attempts", 2**62),
], ids=lambda v: str(v))
def test_a_big_integer_option_is_kept_exactly_or_refused_as_invalid_job(
        any_spool: Spool, field: str, value: int) -> None:
    try:
        job = any_spool.enqueue("note", job_id="j", **{field: value})
    except InvalidJob as exc:
        assert str(value) in str(exc)  # the message names the bad value
        assert list(any_spool.jobs()) == []
        return
    assert getattr(job, field) == value and any_spool.get("j") == job
    (lease,) = any_spool.claim()
    assert any_spool.complete(lease).state is JobState.COMPLETED


def test_an_error_with_a_nul_character_or_over_1024_characters_is_stored_and_settles(
        any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="nul", max_attempts=5)
    any_spool.enqueue("note", job_id="long", max_attempts=5)
    leases = {x.job_id: x for x in any_spool.claim(limit=2)}
    nul = any_spool.fail(leases["nul"], "bad \x00 byte", retryable=False)
    assert nul.state is JobState.DEAD_LETTER
    assert nul.last_error is not None and nul.last_error.startswith("bad ")
    long = any_spool.fail(leases["long"], "e" * 5000)
    assert long.state is JobState.RETRYABLE
    assert long.last_error is not None and 0 < len(long.last_error) <= 1024
    assert long.last_error.startswith("eeee")
    assert any_spool.get("nul") == nul and any_spool.get("long") == long


# ---------------------------------------------------------------- on_conflict


def test_enqueue_keep_returns_the_existing_job_unchanged(any_spool: Spool) -> None:
    first = any_spool.enqueue_result("note", {"v": 1}, job_id="j")
    assert first.outcome == "created" and first.created
    again = any_spool.enqueue_result("note", {"v": 2}, job_id="j", priority=9)
    assert again.outcome == "existing" and not again.created
    assert again.job == first.job == any_spool.get("j")


def test_enqueue_keep_reopens_a_canceled_job(any_spool: Spool) -> None:
    any_spool.enqueue("note", {"v": 1}, job_id="j")
    canceled = any_spool.cancel("j")
    out = any_spool.enqueue_result("note", {"v": 2}, job_id="j")
    assert out.outcome == "reopened"
    assert out.job.state is JobState.READY
    assert out.job.revision > canceled.revision and out.job.attempts == 0


def test_enqueue_replace_rewrites_a_waiting_job_and_reruns_a_finished_one(
        any_spool: Spool) -> None:
    any_spool.enqueue("note", {"v": 1}, job_id="waiting")
    out = any_spool.enqueue_result("note", {"v": 2}, job_id="waiting", on_conflict="replace")
    assert out.outcome == "replaced"
    assert any_spool.get("waiting").payload == {"v": 2}
    assert any_spool.get("waiting").state is JobState.READY

    any_spool.enqueue("other", job_id="done")
    (lease,) = any_spool.claim(kinds=["other"])
    any_spool.complete(lease, "r")
    rerun = any_spool.enqueue_result("other", {"v": 3}, job_id="done", on_conflict="replace")
    assert rerun.outcome == "replaced"
    assert rerun.job.state is JobState.READY and rerun.job.payload == {"v": 3}
    (again,) = any_spool.claim(kinds=["other"])
    assert again.job_id == "done" and again.token > lease.token


def test_enqueue_replace_of_a_leased_job_raises_duplicate_job(any_spool: Spool) -> None:
    any_spool.enqueue("note", {"v": 1}, job_id="j")
    (lease,) = any_spool.claim()
    before = any_spool.get("j")
    with pytest.raises(DuplicateJob):
        any_spool.enqueue("note", {"v": 2}, job_id="j", on_conflict="replace")
    assert any_spool.get("j") == before
    assert any_spool.complete(lease).state is JobState.COMPLETED


def test_enqueue_error_raises_duplicate_job_and_changes_nothing(any_spool: Spool) -> None:
    job = any_spool.enqueue("note", {"v": 1}, job_id="j")
    with pytest.raises(DuplicateJob):
        any_spool.enqueue("note", {"v": 2}, job_id="j", on_conflict="error")
    with pytest.raises(DuplicateJob):
        any_spool.enqueue_many("note", [1, 2], job_ids=["fresh", "j"], on_conflict="error")
    assert any_spool.get("j") == job
    assert [j.id for j in any_spool.jobs()] == ["j"]  # nothing of the refused batch landed


def test_an_id_given_twice_in_one_batch_is_one_job_as_if_enqueued_in_turn(
        any_spool: Spool) -> None:
    """keep stores the first payload, replace the last, error refuses the whole batch."""
    with pytest.raises(DuplicateJob, match="'e' is given twice: in one batch") as caught:
        any_spool.enqueue_many("note", [{"v": 1}, {"v": 2}, {"v": 3}],
                               job_ids=["fresh", "e", "e"], on_conflict="error")
    # Not in the spool: no state to name (it named 'ready', the first's would-be state).
    assert caught.value.state is None
    assert list(any_spool.jobs()) == []
    for policy, want in (("keep", {"v": 1}), ("replace", {"v": 2})):
        results = any_spool.enqueue_many_results(
            "note", [{"v": 1}, {"v": 2}], job_ids=[policy, policy], on_conflict=policy)
        assert [r.outcome for r in results] == ["created", "existing"]
        assert all(r.job.payload == want for r in results)
        assert any_spool.get(policy).payload == want
    # Taken already: replace replaces it with the batch's last payload, once.
    results = any_spool.enqueue_many_results(
        "note", [{"v": 3}, {"v": 4}], job_ids=["keep", "keep"], on_conflict="replace")
    assert [r.outcome for r in results] == ["replaced", "existing"]
    assert any_spool.get("keep").payload == {"v": 4}
    assert sorted(j.id for j in any_spool.jobs()) == ["keep", "replace"]


# ---------------------------------------------------------------- claim


def test_claim_orders_by_priority_then_run_at_then_id(any_spool: Spool) -> None:
    now = time.time()
    for job_id in ("m", "c", "x"):
        any_spool.enqueue("note", job_id=job_id, run_at=now - 100)
    any_spool.enqueue("note", job_id="z", priority=-5, run_at=now - 50)
    any_spool.enqueue("note", job_id="y", priority=-1, run_at=now - 50)
    any_spool.enqueue("note", job_id="a", priority=3, run_at=now - 500)
    any_spool.enqueue("note", job_id="b2", priority=1, run_at=now - 20)
    any_spool.enqueue("note", job_id="b1", priority=1, run_at=now - 10)
    any_spool.enqueue("note", job_id="b3", priority=1, run_at=now - 30)
    got = [x.job_id for x in any_spool.claim(limit=4)]
    got += [x.job_id for x in any_spool.claim(limit=100)]
    assert got == ["z", "y", "c", "m", "x", "b3", "b2", "b1", "a"]


def test_claim_limit_and_kinds_filter(any_spool: Spool) -> None:
    for job_id, kind in [("e1", "email"), ("s1", "sms"), ("p1", "push"), ("e2", "email")]:
        any_spool.enqueue(kind, job_id=job_id)
    assert [x.job_id for x in any_spool.claim(kinds=["email", "push"], limit=2)] == ["e1", "p1"]
    assert [x.job_id for x in any_spool.claim(kinds=("email",), limit=5)] == ["e2"]
    assert any_spool.claim(kinds={"email", "push", "nothing"}, limit=5) == []
    assert [x.job_id for x in any_spool.claim(limit=5)] == ["s1"]
    assert any_spool.claim(limit=5) == []


def test_tokens_are_strictly_increasing_across_claims(any_spool: Spool) -> None:
    for i in range(12):
        any_spool.enqueue("note", job_id=f"j{i:02d}")
    tokens = []
    for _ in range(4):
        for lease in any_spool.claim(limit=3):
            tokens.append(lease.token)
            assert lease.job.lease is not None and lease.job.lease.token == lease.token
            any_spool.release(lease)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_tokens_follow_claim_order_in_a_batch_that_takes_over_an_expired_lease(
        any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="later", priority=1)
    any_spool.enqueue("note", job_id="first", priority=0)
    (stalled,) = any_spool.claim(lease_seconds=0.3)
    assert stalled.job_id == "first"
    sleep_past(stalled.expires_at)
    leases = any_spool.claim(limit=2)
    assert [x.job_id for x in leases] == ["first", "later"]
    tokens = [x.token for x in leases]
    assert tokens == sorted(tokens) and tokens[0] > stalled.token, tokens


def test_a_delayed_job_is_not_claimed_before_its_run_at(any_spool: Spool) -> None:
    far = any_spool.enqueue("note", job_id="far", delay=3600)
    later = any_spool.enqueue("note", job_id="later",
                              run_at=datetime.now(UTC) + timedelta(hours=2))
    soon = any_spool.enqueue("note", job_id="soon", delay=0.5)
    for job, seconds in ((far, 3600), (later, 7200), (soon, 0.5)):
        assert job.state is JobState.RETRYABLE
        assert job.run_at == pytest.approx(time.time() + seconds, abs=5)
    (lease,) = wait_until(any_spool.claim, what="the delayed job to come due")
    assert lease.job_id == "soon"
    assert time.time() >= soon.run_at  # claimed only once due
    assert any_spool.claim(limit=5) == []
    assert {any_spool.get(i).state for i in ("far", "later")} == {JobState.RETRYABLE}


# ---------------------------------------------------------------- leases and fencing


def test_heartbeat_extends_the_lease_and_keeps_the_token(make_any_spool: MakeSpool) -> None:
    spool = make_any_spool(lease_seconds=4.0)
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim(lease_seconds=3.0)
    claimed = spool.get("j")
    time.sleep(1.5)
    renewed = spool.heartbeat(lease)
    assert renewed.token == lease.token and renewed.job_id == "j"
    assert renewed.expires_at > lease.expires_at
    after = spool.get("j")
    assert after.lease.expires_at == pytest.approx(renewed.expires_at)  # type: ignore[union-attr]
    # Lease bookkeeping, not a change of the job: both stores leave updated_at.
    assert after.updated_at == claimed.updated_at
    sleep_past(lease.expires_at)  # past the first expiry, inside the renewed one
    assert spool.claim() == []
    assert spool.complete(lease).state is JobState.COMPLETED


@pytest.mark.parametrize("op", ["complete", "fail", "release", "heartbeat"])
def test_a_stale_token_raises_lease_lost_and_changes_nothing(any_spool: Spool, op: str) -> None:
    any_spool.enqueue("note", job_id="j")
    stale, current = _stale_lease_on(any_spool, "j")
    before = any_spool.get("j")
    calls: dict[str, Callable[[], Any]] = {
        "complete": lambda: any_spool.complete(stale, "late"),
        "fail": lambda: any_spool.fail(stale, "late", retryable=False),
        "release": lambda: any_spool.release(stale),
        "heartbeat": lambda: any_spool.heartbeat(stale),
    }
    with pytest.raises(LeaseLost) as info:
        calls[op]()
    assert (info.value.job_id, info.value.token) == ("j", stale.token)
    assert any_spool.get("j") == before
    assert any_spool.complete(current, "mine").result == "mine"
    with pytest.raises(LeaseLost):
        any_spool.complete(current, "twice")
    assert any_spool.get("j").result == "mine"


def test_an_expired_lease_is_lost_and_the_job_is_claimed_again(make_any_spool: MakeSpool) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    spool.enqueue("note", job_id="j")
    (first,) = spool.claim(owner="stalled", lease_seconds=0.5)
    (second,) = wait_until(lambda: spool.claim(owner="rescuer"), what="the lease to expire")
    assert time.time() >= first.expires_at
    assert (second.job_id, second.owner, second.job.attempts) == ("j", "rescuer", 2)
    assert second.token > first.token
    with pytest.raises(LeaseLost):
        spool.complete(first, "late")
    assert spool.complete(second, "rescued").result == "rescued"


def test_recover_reclaims_an_expired_lease(make_any_spool: MakeSpool) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim(lease_seconds=0.5)
    sleep_past(lease.expires_at)
    report = spool.recover()
    assert "j" in report.leases_reclaimed
    job = spool.get("j")
    assert job.state is JobState.RETRYABLE and job.lease is None and job.attempts == 1
    with pytest.raises(LeaseLost):
        spool.complete(lease)
    (again,) = wait_until(spool.claim, what="the reclaimed job to come due")
    assert again.job_id == "j" and again.token > lease.token


# ---------------------------------------------------------------- fail, release, cancel, requeue


def test_fail_retryable_backs_off_from_retry_base_seconds(make_any_spool: MakeSpool) -> None:
    spool = make_any_spool(retry_base_seconds=10.0, retry_max_seconds=100.0)
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    at = time.time()
    job = spool.fail(lease, "db down")
    assert job.state is JobState.RETRYABLE and job.lease is None and job.attempts == 1
    assert job.last_error is not None and "db down" in job.last_error
    assert 5.0 - 1 <= job.run_at - at <= 15.0 + 1  # base * 2**0, jitter within ±50 %
    assert spool.claim() == []


def test_fail_when_attempts_are_exhausted_dead_letters(any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="j", max_attempts=2)
    (lease,) = any_spool.claim()
    assert any_spool.fail(lease, "try 1", delay=0.0).state is JobState.RETRYABLE
    (lease,) = wait_until(any_spool.claim, what="the retry to come due")
    assert lease.job.attempts == 2
    dead = any_spool.fail(lease, "try 2")
    assert dead.state is JobState.DEAD_LETTER and "try 2" in (dead.last_error or "")
    assert any_spool.claim() == []


def test_fail_permanent_dead_letters_at_once(any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="j", max_attempts=5)
    (lease,) = any_spool.claim()
    job = any_spool.fail(lease, "bad input", retryable=False)
    assert job.state is JobState.DEAD_LETTER and job.attempts == 1


def test_release_gives_the_job_back_without_counting_the_attempt(any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="j", max_attempts=1)
    (lease,) = any_spool.claim()
    job = any_spool.release(lease)
    assert (job.state, job.attempts, job.lease) == (JobState.READY, 0, None)
    (again,) = any_spool.claim()
    assert again.token > lease.token and again.job.attempts == 1


@pytest.mark.parametrize("start", ["ready", "retryable", "prepared"])
def test_cancel_a_waiting_job(any_spool: Spool, start: str) -> None:
    if start == "prepared":
        any_spool.prepare("note", job_id="j")
    else:
        any_spool.enqueue("note", job_id="j", delay=100 if start == "retryable" else 0)
    job = any_spool.cancel("j")
    assert job.state is JobState.CANCELED
    assert any_spool.claim() == []
    with pytest.raises(InvalidTransition):
        any_spool.cancel("j")


def test_cancel_a_leased_job_and_its_holder_loses_the_lease(any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="j")
    (lease,) = any_spool.claim()
    canceled = any_spool.cancel("j")
    assert canceled.state is JobState.CANCELED and canceled.lease is None
    for act in (lambda: any_spool.heartbeat(lease), lambda: any_spool.complete(lease),
                lambda: any_spool.fail(lease, "x"), lambda: any_spool.release(lease)):
        with pytest.raises(LeaseLost):
            act()
    assert any_spool.get("j") == canceled


def test_requeue_moves_a_dead_letter_back_to_ready_with_fresh_attempts(any_spool: Spool) -> None:
    any_spool.enqueue("note", {"p": 1}, job_id="j", max_attempts=1)
    (lease,) = any_spool.claim()
    assert any_spool.fail(lease, "x").state is JobState.DEAD_LETTER
    job = any_spool.requeue("j")
    assert (job.state, job.attempts, job.payload) == (JobState.READY, 0, {"p": 1})
    (again,) = any_spool.claim()
    assert again.token > lease.token
    assert any_spool.complete(again).state is JobState.COMPLETED
    any_spool.enqueue("note", job_id="waiting")
    with pytest.raises(InvalidTransition):
        any_spool.requeue("waiting")  # not finished: nothing to run again


# ---------------------------------------------------------------- two-phase


def test_prepare_commit_abort_with_two_reservations(any_spool: Spool) -> None:
    a = any_spool.prepare("note", {"v": 1}, job_id="j")
    b = any_spool.prepare("note", {"v": 1}, job_id="j")
    assert a.reservation_id != b.reservation_id
    assert a.job.state is JobState.PREPARED
    assert any_spool.claim() == []
    any_spool.abort(a)
    assert any_spool.get("j").state is JobState.PREPARED  # b still holds it
    assert any_spool.commit(b).state is JobState.READY
    assert any_spool.commit(b).state is JobState.READY  # idempotent
    (lease,) = any_spool.claim()
    assert lease.job_id == "j" and lease.job.payload == {"v": 1}


def test_the_last_abort_cancels_and_a_new_prepare_reopens(any_spool: Spool) -> None:
    a = any_spool.prepare("note", job_id="j")
    b = any_spool.prepare("note", job_id="j")
    any_spool.abort(b)
    any_spool.abort(a)
    canceled = any_spool.get("j")
    assert canceled.state is JobState.CANCELED
    c = any_spool.prepare("note", job_id="j")
    assert c.job.state is JobState.PREPARED and c.job.revision > canceled.revision
    assert any_spool.commit(c).state is JobState.READY


def test_commit_of_a_job_an_operator_canceled_is_refused(any_spool: Spool) -> None:
    r = any_spool.prepare("note", job_id="j")
    canceled = any_spool.cancel("j")
    with pytest.raises(InvalidTransition):
        any_spool.commit(r)
    assert any_spool.get("j") == canceled


# ---------------------------------------------------------------- reading: jobs, stats, wait


def test_jobs_lists_by_state_then_id_and_filters_by_state_and_kind(any_spool: Spool) -> None:
    for job_id, kind in [("b1", "b"), ("a2", "a"), ("a1", "a"), ("b2", "b")]:
        any_spool.enqueue(kind, job_id=job_id, delay=30 if job_id == "b2" else 0)
    (lease,) = any_spool.claim(kinds=["a"])
    assert lease.job_id == "a2"  # enqueued first: the earlier run_at
    any_spool.complete(lease)
    assert [j.id for j in any_spool.jobs()] == ["a1", "b1", "b2", "a2"]  # ready, retryable, completed
    assert [(j.id, str(j.state)) for j in any_spool.jobs(kind="a")] == [("a1", "ready"),
                                                                         ("a2", "completed")]
    assert [j.id for j in any_spool.jobs(state=JobState.READY)] == ["a1", "b1"]
    assert [j.id for j in any_spool.jobs(state="ready", kind="b")] == ["b1"]
    assert list(any_spool.jobs(state=JobState.DEAD_LETTER)) == []
    for j in any_spool.jobs():
        assert j == any_spool.get(j.id)
    with pytest.raises(InvalidJob):
        any_spool.jobs(state="finished")


def test_stats_counts_jobs_per_state(any_spool: Spool) -> None:
    assert set(stat_counts(any_spool.stats()).values()) == {0}
    for i in range(6):
        any_spool.enqueue("note", job_id=f"j{i}")
    any_spool.enqueue("note", job_id="late", delay=100)
    any_spool.prepare("note", job_id="p")
    leases = any_spool.claim(limit=4)
    any_spool.complete(leases[0])
    any_spool.fail(leases[1], "boom", retryable=False)
    any_spool.cancel(leases[2].job_id)
    counts = stat_counts(any_spool.stats())
    assert counts == {"prepared": 1, "ready": 2, "leased": 1, "retryable": 1, "completed": 1,
                      "dead_letter": 1, "canceled": 1}
    assert set(counts) == set(STATE_DIRS)
    assert any_spool.stats()["ready"] == 2


def test_wait_returns_the_terminal_job_another_thread_finished(any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="j")
    (lease,) = any_spool.claim()
    t = threading.Thread(target=lambda: (time.sleep(0.2), any_spool.complete(lease, "late")))
    t.start()
    try:
        job = any_spool.wait("j", timeout=30.0)
    finally:
        t.join(30)
    assert (job.state, job.result) == (JobState.COMPLETED, "late")
    assert any_spool.wait("j", timeout=0.0) == job  # terminal: at once


def test_wait_times_out_on_a_job_that_does_not_finish(any_spool: Spool) -> None:
    any_spool.enqueue("note", job_id="j")
    with pytest.raises(TimeoutError):
        any_spool.wait("j", timeout=0.3)
    assert any_spool.get("j").state is JobState.READY


def test_prune_keeps_the_newest_terminal_jobs(any_spool: Spool) -> None:
    for i in range(5):
        any_spool.enqueue("note", job_id=f"c{i}")
        (lease,) = any_spool.claim()
        any_spool.complete(lease)
        time.sleep(0.01)  # distinct updated_at: "newest" is well defined
    any_spool.enqueue("note", job_id="waiting")
    report = any_spool.prune(keep=2)
    assert sorted(report.completed) == ["c0", "c1", "c2"]
    assert sorted(report.pruned) == ["c0", "c1", "c2"]
    assert sorted(j.id for j in any_spool.jobs()) == ["c3", "c4", "waiting"]
    with pytest.raises(JobNotFound):
        any_spool.get("c0")
    # A pruned id is free again.
    assert any_spool.enqueue_result("note", job_id="c0").outcome == "created"


def test_short_lived_spools_settling_a_few_jobs_each_still_prune(
        make_any_spool: MakeSpool) -> None:
    """Each open settles 20 jobs, fewer than the pruning interval (64): the terminal jobs
    kept stay bounded across opens instead of growing by every one (a cron-run
    `run-until-idle`)."""
    make_any_spool(keep_terminal=5).close()
    for _ in range(8):
        spool = make_any_spool()
        spool.enqueue_many("work", [{"i": i} for i in range(20)])
        while leases := spool.claim(limit=10):
            spool.complete_many([(lease, None) for lease in leases])
        spool.close()
    assert stat_counts(make_any_spool().stats())["completed"] <= 5 + 64


@pytest.mark.parametrize("bad", [
    {"max_job_bytes": 100}, {"lease_seconds": -1.0}, {"max_attempts": 0},
    {"lease_seconds": math.nan}, {"keep_terminal_seconds": math.inf}, {"max_due": 0},
    {"max_lag_seconds": math.nan}, {"clock": 5},
], ids=repr)
def test_a_refused_option_leaves_the_spool_as_it_was(make_any_spool: MakeSpool,
                                                     bad: dict[str, Any]) -> None:
    """Refused with InvalidJob naming the option, before anything is stored: the first
    open must not save it as the spool's setting (then every later open failed)."""
    with pytest.raises(InvalidJob) as info:
        make_any_spool(**bad)
    assert info.value.field == next(iter(bad))
    spool = make_any_spool()
    spool.enqueue("k")
    assert spool.settings.max_job_bytes >= 1024 and spool.settings.lease_seconds > 0


def test_a_delay_past_year_9999_or_an_integer_past_64_bits_is_refused(
        any_spool: Spool) -> None:
    """The bounds run_at and the stores' integers have, reached another way: refused with
    InvalidJob naming the argument, nothing written, the lease untouched."""
    for bad in ({"delay": 1e300}, {"priority": 1 << 63}, {"max_attempts": 1 << 70},
                {"priority": -(1 << 63) - 1}):
        with pytest.raises(InvalidJob) as info:
            any_spool.enqueue("k", **bad)
        assert info.value.field == next(iter(bad))
    assert list(any_spool.jobs()) == []
    any_spool.enqueue("k", job_id="j", priority=(1 << 63) - 1)
    (lease,) = any_spool.claim()
    with pytest.raises(InvalidJob):
        any_spool.release(lease, delay=1e300)
    with pytest.raises(InvalidJob):
        any_spool.fail(lease, "boom", delay=1e300)
    assert any_spool.get("j").state is JobState.LEASED
    any_spool.complete(lease)


def test_an_overlong_owner_is_refused_in_a_short_line(any_spool: Spool) -> None:
    """Found in a DESIGN audit: the error quoted the whole 100,000-character owner."""
    any_spool.enqueue("k", job_id="j")
    with pytest.raises(InvalidJob) as info:
        any_spool.claim(owner="o" * 100_000)
    said = str(info.value)
    assert info.value.field == "owner" and len(said) < 200, said[:300]
    assert "100000 characters" in said and "must be 1 to 128 printable characters" in said
    assert any_spool.get("j").state is JobState.READY


def test_the_last_instant_of_the_year_9999_is_taken_and_the_next_refused(
        any_spool: Spool) -> None:
    """Found in a time probe: 9999-12-31T23:59:59.999999Z rounds to the next second as a
    float, and was refused as "past the year 9999 (milliseconds instead of seconds?)"."""
    last = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    job = any_spool.enqueue("k", run_at=last)
    assert job.run_at == any_spool.get(job.id).run_at <= last.timestamp()
    with pytest.raises(InvalidJob, match="past the year 9999"):
        any_spool.enqueue("k", run_at=last.timestamp() + 2)


def test_epoch_seconds_of_the_year_10000_are_refused_not_moved_back(any_spool: Spool) -> None:
    """Found in a schedules probe: run_at=253402300800 (10000-01-01T00:00:00Z) was taken
    and stored a second earlier, while the same instant written as text was refused."""
    with pytest.raises(InvalidJob, match="past the year 9999"):
        any_spool.enqueue("k", job_id="late", run_at=253402300800.0)
    with pytest.raises(InvalidJob, match="past the year 9999"):
        any_spool.enqueue("k", job_id="late", run_at=253402300800)
    assert any_spool.stats().total == 0
    # Within the last second of the year 9999: the latest time stored.
    assert any_spool.enqueue("k", job_id="last", run_at=253402300799.5).run_at == 253402300799.0


def test_health_reports_dead_letters_and_a_stuck_queue_with_the_same_codes(
        make_any_spool: MakeSpool) -> None:
    """One alert rule serves both stores: the same reason codes for the same conditions
    (PostgreSQL said `ok` with a dead letter and named a backlog `due_backlog`)."""
    spool = make_any_spool(max_attempts=1)
    assert spool.health().ok
    spool.enqueue("k", job_id="poison")
    (lease,) = spool.claim()
    spool.fail(lease, "boom")
    verdict = spool.health()
    assert not verdict.ok and [r.code for r in verdict.reasons] == ["dead_letters"]
    spool.enqueue("k", job_id="waiting")
    time.sleep(0.05)
    codes = [r.code for r in spool.health(max_due_age=0.01).reasons]
    # (the file spool adds `ready_not_claimed`, from the file's age in ready/)
    assert codes[:2] == ["dead_letters", "queue_not_draining"]
    with pytest.raises(ValueError, match="max_due_age"):
        spool.health(max_due_age=0)


def test_wrong_objects_for_leases_and_reservations_are_refused_in_one_line(
        any_spool: Spool) -> None:
    """A job id or None where a Lease belongs failed on a missing attribute deep in the
    store; now InvalidJob says what was expected, and nothing changes."""
    any_spool.enqueue("k", job_id="j")
    (lease,) = any_spool.claim()
    calls = [lambda: any_spool.complete("j"), lambda: any_spool.complete(None),  # type: ignore[arg-type]
             lambda: any_spool.fail("j", "x"), lambda: any_spool.release(None),  # type: ignore[arg-type]
             lambda: any_spool.heartbeat("j"),  # type: ignore[arg-type]
             lambda: any_spool.complete_many([("j", None)]),  # type: ignore[list-item]
             lambda: any_spool.complete_many([lease]),  # type: ignore[list-item]
             lambda: any_spool.heartbeat_many([lease, "j"]),  # type: ignore[list-item]
             lambda: any_spool.commit(None), lambda: any_spool.abort("j"),  # type: ignore[arg-type]
             lambda: any_spool.enqueue_many("k", "abc")]
    for call in calls:
        with pytest.raises(InvalidJob) as info:
            call()
        assert "expected" in str(info.value) or "payloads" in str(info.value)
        assert isinstance(info.value, TypeError)  # also what Python's own checks raise
    assert any_spool.get("j").state is JobState.LEASED
    assert [j.id for j in any_spool.jobs()] == ["j"]
    any_spool.complete(lease)


def test_requeue_runs_a_completed_job_again_from_scratch(any_spool: Spool) -> None:
    """DESIGN §3: completed and dead-lettered jobs run again only through requeue."""
    any_spool.enqueue("k", {"v": 1}, job_id="done")
    (lease,) = any_spool.claim()
    any_spool.complete(lease, {"answer": 42})
    again = any_spool.requeue("done")
    assert (again.state, again.attempts, again.result) == (JobState.READY, 0, None)
    (lease,) = any_spool.claim()
    assert lease.token > 0 and any_spool.complete(lease, "second").result == "second"
    moved = any_spool.requeue_matching(states=["completed"])
    assert [j.id for j in moved] == ["done"]
    assert any_spool.get("done").state is JobState.READY


def test_prepares_of_one_id_stop_before_the_job_outgrows_its_size_limit(
        make_any_spool: MakeSpool) -> None:
    """Each producer's reservation grows the job; past what a new job may use, the next
    prepare is refused with JobTooLarge, and the job as held stays readable and whole."""
    spool = make_any_spool(max_job_bytes=2048)
    held = [spool.prepare("k", {"pad": "x" * 1200}, job_id="shared")]
    with pytest.raises(JobTooLarge, match="commit or abort"):
        for _ in range(200):
            held.append(spool.prepare("k", {"pad": "x" * 1200}, job_id="shared"))
    job = spool.get("shared")
    assert len(job.reservations) == len(held) < 200
    assert len(orjson.dumps(job.to_dict())) <= 2048
    assert spool.commit(held[-1]).state is JobState.READY


def test_a_failure_near_the_size_limit_keeps_a_cut_traceback_that_fits(
        make_any_spool: MakeSpool) -> None:
    """DESIGN §9 (sizes): a job admitted near `max_job_bytes` still records its failure:
    the error and traceback are cut so the stored job fits, its raising frame kept."""
    from jobspool.queue.job import encode_job
    from jobspool.queue.jobsize import admission_limit

    spool = make_any_spool(max_job_bytes=4096)
    pad = "x" * (admission_limit(4096) - 400)
    spool.enqueue("k", {"pad": pad}, job_id="big")
    (lease,) = spool.claim()
    # A long traceback arrives through the worker, as a Failure.
    from jobspool.queue.machine import Failure

    failures = [(lease, Failure(error="boom " * 2000, traceback="frame\n" * 2000 + "LAST"),
                 True, None)]
    (job,) = spool.fail_many(failures)
    assert not isinstance(job, BaseException), job
    stored = spool.get("big")
    assert len(encode_job(stored)) <= 4096
    assert stored.last_error and stored.last_error.startswith("boom")
    # Both texts keep part of the room: the traceback was dropped whole (None) while the
    # error kept ~900 characters (found by a sizes probe).
    assert stored.traceback is not None
    assert stored.traceback.startswith("frame\n") and stored.traceback.endswith("LAST")
    assert "characters cut" in stored.traceback
    assert len(stored.last_error) > 200


@pytest.mark.parametrize("char", ["\U0001F600", "\x01", "\u00e9"], ids=["emoji", "control", "accent"])
def test_a_non_ascii_error_near_the_size_limit_is_cut_not_dropped(
        make_any_spool: MakeSpool, char: str) -> None:
    """Found by a parity probe: an error of 4-byte (or 6-byte escaped) characters on a
    job near the limit was emptied whole (last_error '', no traceback), where the same
    error in ASCII was cut to fit: the byte overage was taken off as characters."""
    from jobspool.queue.job import encode_job
    from jobspool.queue.jobsize import admission_limit
    from jobspool.queue.machine import Failure

    spool = make_any_spool(max_job_bytes=8192)
    pad = "y" * (admission_limit(8192) - 400)
    spool.enqueue("k", pad, job_id="big")
    (lease,) = spool.claim()
    text = "ValueError: " + char * 1000
    (job,) = spool.fail_many([(lease, Failure(error=text, traceback="frame\n" + text),
                               False, None)])
    assert not isinstance(job, BaseException), job
    stored = spool.get("big")
    assert len(encode_job(stored)) <= 8192
    assert stored.last_error is not None and stored.last_error.startswith("ValueError: " + char)
    assert stored.state is JobState.DEAD_LETTER


def test_a_claim_for_no_kinds_claims_nothing(any_spool: Spool) -> None:
    # Found in a PostgreSQL pass: kinds=[] claimed jobs of every kind (no filter at all).
    any_spool.enqueue("a", job_id="a")
    any_spool.enqueue("b", job_id="b")
    assert any_spool.claim(kinds=[], limit=5) == []
    assert {j.state for j in any_spool.jobs()} == {JobState.READY}


@pytest.mark.parametrize("op", ["complete", "release", "cancel"])
def test_a_job_settled_inside_its_own_fenced_block_stays_settled(any_spool: Spool,
                                                                  op: str) -> None:
    # Found in a PostgreSQL pass: the block's end extended a lease that was no longer
    # there, a raw CheckViolation rolled the settle back, and the job stayed leased.
    any_spool.enqueue("k", job_id="j")
    (lease,) = any_spool.claim()
    with pytest.raises(LeaseLost), any_spool.fenced(lease):
        if op == "complete":
            any_spool.complete(lease, "done")
        elif op == "release":
            any_spool.release(lease)
        else:
            any_spool.cancel("j")
    expected = {"complete": JobState.COMPLETED, "release": JobState.READY,
                "cancel": JobState.CANCELED}[op]
    assert any_spool.get("j").state is expected


def test_a_backfilled_job_has_not_waited_for_max_lag_seconds(make_any_spool: MakeSpool) -> None:
    # Found in a producers pass: lag was measured from run_at, so one job enqueued with a
    # run_at an hour back refused every producer under max_lag_seconds=600.
    make_any_spool(max_lag_seconds=600.0).enqueue("k", "backfill", run_at=time.time() - 3600)
    other = make_any_spool(max_lag_seconds=600.0)  # another producer: measures afresh
    other.enqueue("k", "next")  # admitted: nothing has waited yet
    assert sorted(j.payload for j in other.jobs(JobState.READY)) == ["backfill", "next"]


def test_recover_prunes_after_replaying_as_design_orders_it(
        make_any_spool: MakeSpool) -> None:
    """Found in a DESIGN audit of the PostgreSQL store: the file store pruned from the scan
    it made before replay, so the job replay aborted (canceled) left one terminal job over
    `keep_terminal` until the next recover; PostgreSQL pruned it at once (DESIGN §6: replay,
    then retention)."""
    spool = make_any_spool(prepare_grace_seconds=0.1, keep_terminal=2)
    spool.prepare("a", job_id="p")
    for i in range(2):
        spool.enqueue("c", job_id=f"c{i}")
        spool.cancel(f"c{i}")
        time.sleep(0.01)  # distinct finishing times: c0 is the oldest
    time.sleep(0.2)  # past the prepare grace
    report = spool.recover(replay={"a": lambda job: "aborted"})
    assert report.replayed_aborted == ("p",)
    assert list(report.pruned) == ["c0"]
    assert sorted(j.id for j in spool.jobs(state="canceled")) == ["c1", "p"]
