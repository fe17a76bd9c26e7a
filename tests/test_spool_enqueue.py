"""Enqueue: where jobs land, idempotence on job_id, delay, reopen of canceled jobs, lookups."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import Job, JobState, Spool
from jobspool.errors import InvalidTransition, JobNotFound, SpoolError
from tests.helpers_spool import (
    assert_disk_consistent,
    disk_counts,
    file_bytes,
    read_raw,
    stat_counts,
)
from tests.spools import make_spool


def test_enqueue_writes_one_ready_file_named_by_id(spool: Spool, spool_root: Path,
                                                   clock: Any) -> None:
    job = spool.enqueue("note", {"text": "hi"}, job_id="n1")
    assert isinstance(job, Job)
    assert job.id == "n1"
    assert job.kind == "note"
    assert job.payload == {"text": "hi"}
    assert job.state is JobState.READY
    assert job.attempts == 0
    assert job.max_attempts == 5
    assert job.priority == 0
    assert job.lease is None
    assert job.created_at == clock.now
    assert job.run_at <= clock.now
    assert assert_disk_consistent(spool_root) == {"n1": "ready"}
    raw = read_raw(spool_root, "ready", "n1")
    assert raw["payload"] == {"text": "hi"}
    assert raw["kind"] == "note"


def test_enqueue_without_id_generates_ids_in_creation_order(spool: Spool) -> None:
    ids = [spool.enqueue("note", i).id for i in range(50)]
    assert len(set(ids)) == 50
    assert ids == sorted(ids)


def test_enqueue_defaults_payload_to_none(spool: Spool) -> None:
    assert spool.enqueue("note").payload is None
    assert spool.get(spool.enqueue("note").id).payload is None


def test_get_returns_what_enqueue_returned(spool: Spool) -> None:
    job = spool.enqueue("note", [1, 2.5, "x", None, {"k": True}], priority=3, max_attempts=2)
    assert spool.get(job.id) == job


def test_get_of_an_unknown_id_raises_job_not_found(spool: Spool) -> None:
    with pytest.raises(JobNotFound) as info:
        spool.get("nope")
    assert info.value.job_id == "nope"
    assert "nope" in str(info.value)


def test_enqueue_with_an_existing_id_returns_the_job_unchanged(spool: Spool,
                                                               spool_root: Path) -> None:
    first = spool.enqueue("note", {"v": 1}, job_id="same")
    before = file_bytes(spool_root, "same")
    again = spool.enqueue("note", {"v": 2}, job_id="same", priority=9)
    assert again == first
    assert again.payload == {"v": 1}
    assert file_bytes(spool_root, "same") == before


@pytest.mark.parametrize("finish", ["leased", "completed", "dead_letter", "retryable"])
def test_enqueue_with_the_id_of_a_job_in_another_state_returns_it_unchanged(
    spool: Spool, spool_root: Path, finish: str
) -> None:
    spool.enqueue("note", job_id="j")
    if finish != "ready":
        (lease,) = spool.claim()
        if finish == "completed":
            spool.complete(lease, "done")
        elif finish == "dead_letter":
            spool.fail(lease, "boom", retryable=False)
        elif finish == "retryable":
            spool.fail(lease, "later")
    before = file_bytes(spool_root, "j")
    job = spool.enqueue("note", {"new": True}, job_id="j")
    assert str(job.state) == finish
    assert job.payload is None
    assert file_bytes(spool_root, "j") == before


def test_enqueue_reopens_a_canceled_job(spool: Spool, spool_root: Path) -> None:
    spool.enqueue("note", {"v": 1}, job_id="j")
    (lease,) = spool.claim()
    canceled = spool.cancel("j")
    assert canceled.state is JobState.CANCELED
    reopened = spool.enqueue("note", {"v": 2}, job_id="j")
    assert reopened.state is JobState.READY
    assert reopened.revision > canceled.revision
    assert reopened.attempts == 0
    assert reopened.lease is None
    assert assert_disk_consistent(spool_root) == {"j": "ready"}
    (lease2,) = spool.claim()
    assert lease2.job_id == "j"
    assert lease2.token > lease.token


def test_enqueue_with_delay_lands_in_retryable_and_is_not_claimable_until_due(
    spool: Spool, spool_root: Path, clock: Any
) -> None:
    job = spool.enqueue("note", job_id="later", delay=10.0)
    assert job.state is JobState.RETRYABLE
    assert job.run_at == pytest.approx(clock.now + 10.0)
    assert assert_disk_consistent(spool_root) == {"later": "retryable"}
    assert spool.claim() == []
    clock.advance(9.9)
    assert spool.claim() == []
    clock.advance(0.1)
    (lease,) = spool.claim()
    assert lease.job_id == "later"
    assert lease.job.attempts == 1


def test_enqueue_with_zero_delay_is_ready_now(spool: Spool, clock: Any) -> None:
    job = spool.enqueue("note", delay=0.0)
    assert job.state is JobState.READY
    assert [x.job_id for x in spool.claim()] == [job.id]


def test_enqueue_many_writes_every_job(spool: Spool, spool_root: Path) -> None:
    out = spool.enqueue_many("note", [{"i": i} for i in range(20)])
    assert [j.payload for j in out] == [{"i": i} for i in range(20)]
    assert all(j.state is JobState.READY for j in out)
    assert len({j.id for j in out}) == 20
    assert disk_counts(spool_root)["ready"] == 20
    assert_disk_consistent(spool_root)


def test_enqueue_many_with_ids_is_idempotent_per_id(spool: Spool, spool_root: Path) -> None:
    spool.enqueue("note", "old", job_id="b")
    out = spool.enqueue_many("note", ["a", "new", "c"], job_ids=["a", "b", "c"])
    assert [j.id for j in out] == ["a", "b", "c"]
    assert out[1].payload == "old"
    assert disk_counts(spool_root)["ready"] == 3


def test_enqueue_many_with_delay_and_priority(spool: Spool, clock: Any) -> None:
    out = spool.enqueue_many("note", [1, 2], delay=5.0, priority=-2)
    assert all(j.state is JobState.RETRYABLE and j.priority == -2 for j in out)
    assert spool.claim(limit=10) == []
    clock.advance(5.0)
    assert len(spool.claim(limit=10)) == 2


def test_max_attempts_defaults_to_the_spool_setting_and_can_be_overridden(
    tmp_path: Path, clock: Any
) -> None:
    s = make_spool(tmp_path / "s", clock=clock, max_attempts=3)
    try:
        assert s.enqueue("note").max_attempts == 3
        assert s.enqueue("note", max_attempts=7).max_attempts == 7
    finally:
        s.close()


def test_revision_increments_by_one_on_every_write(spool: Spool, spool_root: Path,
                                                   clock: Any) -> None:
    def rev() -> int:
        _state, data = file_bytes(spool_root, "j")
        return int(orjson.loads(data)["revision"])

    seen = [spool.enqueue("note", job_id="j").revision]
    assert rev() == seen[-1]
    steps = [
        lambda: spool.claim(),
        lambda: spool.heartbeat(lease),
        lambda: spool.fail(lease, "x"),
        lambda: clock.advance(10_000),
        lambda: spool.claim(),
        lambda: spool.release(lease),
        lambda: spool.claim(),
        lambda: spool.fail(lease, "final", retryable=False),
        lambda: spool.requeue("j"),
        lambda: spool.cancel("j"),
        lambda: spool.enqueue("note", job_id="j"),
        lambda: spool.claim(),
        lambda: spool.complete(lease),
    ]
    for step in steps:
        out = step()
        if out is None:  # advancing the clock writes nothing
            assert rev() == seen[-1]
            continue
        if isinstance(out, list):
            (lease,) = out
        seen.append(rev())
    assert seen == list(range(seen[0], seen[0] + len(seen))), seen
    assert spool.get("j").revision == seen[-1]


def test_jobs_lists_by_state_and_kind(spool: Spool, clock: Any) -> None:
    spool.enqueue("a", job_id="a1")
    spool.enqueue("a", job_id="a2")
    spool.enqueue("b", job_id="b1")
    spool.enqueue("b", job_id="b2", delay=30)
    (lease,) = spool.claim(kinds=["a"])
    spool.complete(lease)
    assert sorted(j.id for j in spool.jobs()) == ["a1", "a2", "b1", "b2"]
    assert sorted(j.id for j in spool.jobs(kind="a")) == ["a1", "a2"]
    assert sorted(j.id for j in spool.jobs(state=JobState.READY)) == ["a2", "b1"]
    assert sorted(j.id for j in spool.jobs(state=JobState.READY, kind="b")) == ["b1"]
    assert [j.id for j in spool.jobs(state=JobState.COMPLETED)] == ["a1"]
    assert [j.id for j in spool.jobs(state=JobState.RETRYABLE)] == ["b2"]
    assert list(spool.jobs(state=JobState.DEAD_LETTER)) == []
    assert list(spool.jobs(kind="zzz")) == []
    for j in spool.jobs():
        assert j == spool.get(j.id)


def test_jobs_accepts_a_state_name_as_a_string(spool: Spool) -> None:
    spool.enqueue("a", job_id="a1")
    assert [j.id for j in spool.jobs(state="ready")] == ["a1"]  # type: ignore[arg-type]


def test_stats_counts_jobs_per_state(spool: Spool, spool_root: Path, clock: Any) -> None:
    assert set(stat_counts(spool.stats()).values()) == {0}
    for i in range(6):
        spool.enqueue("note", job_id=f"j{i}")
    spool.enqueue("note", job_id="late", delay=100)
    leases = spool.claim(limit=4)
    spool.complete(leases[0])
    spool.fail(leases[1], "boom", retryable=False)
    spool.cancel(leases[2].job_id)
    counts = stat_counts(spool.stats())
    assert counts == {"prepared": 0, "ready": 2, "leased": 1, "retryable": 1, "completed": 1,
                      "dead_letter": 1, "canceled": 1}
    assert counts == disk_counts(spool_root)


def test_a_second_spool_on_the_same_root_sees_the_jobs_of_the_first(
    spool: Spool, spool_root: Path, clock: Any
) -> None:
    spool.enqueue("note", {"v": 1}, job_id="shared")
    other = make_spool(spool_root, clock=clock, lease_seconds=30.0)
    try:
        assert other.get("shared") == spool.get("shared")
        (lease,) = other.claim()
        assert lease.job_id == "shared"
        assert spool.get("shared").state is JobState.LEASED
        assert spool.claim() == []
        other.complete(lease, "ok")
        assert spool.get("shared").result == "ok"
    finally:
        other.close()


def test_reopening_a_spool_keeps_its_jobs(spool_root: Path, clock: Any) -> None:
    s = make_spool(spool_root, durable=True, clock=clock)
    s.enqueue("note", {"v": 1}, job_id="kept")
    s.close()
    s2 = make_spool(spool_root, create=False, durable=True, clock=clock)
    try:
        assert s2.get("kept").payload == {"v": 1}
    finally:
        s2.close()


def test_an_unknown_spool_format_version_is_refused(spool_root: Path, clock: Any) -> None:
    make_spool(spool_root, clock=clock).close()
    meta = orjson.loads((spool_root / "spool.json").read_bytes())
    key = next(k for k in ("format", "version", "format_version", "v") if k in meta)
    meta[key] = 999
    (spool_root / "spool.json").write_bytes(orjson.dumps(meta))
    with pytest.raises(SpoolError):
        make_spool(spool_root, clock=clock)


def test_cancel_of_an_unknown_job_raises_job_not_found(spool: Spool) -> None:
    with pytest.raises(JobNotFound):
        spool.cancel("ghost")
    with pytest.raises(JobNotFound):
        spool.requeue("ghost")


def test_a_corrupt_job_file_is_skipped_by_claim_stats_and_jobs_with_a_log_record(
    spool: Spool, spool_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool.enqueue("note", job_id="a")
    spool.enqueue("note", job_id="c")
    (spool_root / "ready" / "b.json").write_bytes(b"\x00\xffgarbage{")
    (spool_root / "ready" / "d.json").write_bytes(orjson.dumps({"id": "d", "state": "ready"}))
    (spool_root / "ready" / "e.json").write_bytes(
        (spool_root / "ready" / "a.json").read_bytes()  # id 'a' in a file named e.json
    )
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sorted(j.id for j in spool.jobs()) == ["a", "c"]
        counts = stat_counts(spool.stats())
        leases = spool.claim(limit=10)
    assert sorted(x.job_id for x in leases) == ["a", "c"]
    assert counts["ready"] in (2, 5)  # a count of files is fine; a crash is not
    # A log record for operators and/or a warning for code; silence is not acceptable.
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    warned = [str(w.message) for w in caught]
    for name in ("b.json", "d.json", "e.json"):
        assert any(name in m for m in logged + warned), f"nothing reported {name}"
    for x in leases:
        spool.complete(x)
    assert spool.claim(limit=10) == []
    assert (spool_root / "ready" / "b.json").read_bytes() == b"\x00\xffgarbage{"


def test_a_job_file_whose_state_field_disagrees_with_its_directory_is_not_claimed(
    spool: Spool, spool_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool.enqueue("note", job_id="x")
    (lease,) = spool.claim()
    spool.complete(lease)
    data = (spool_root / "completed" / "x.json").read_bytes()
    (spool_root / "ready" / "y.json").write_bytes(data.replace(b'"x"', b'"y"'))
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert spool.claim() == []
        assert [j.id for j in spool.jobs()] == ["x"]
        assert stat_counts(spool.stats())["completed"] == 1


def test_cancel_then_requeue_then_complete(spool: Spool) -> None:
    spool.enqueue("note", job_id="j")
    assert spool.cancel("j").state is JobState.CANCELED
    with pytest.raises(InvalidTransition):
        spool.cancel("j")
    assert spool.requeue("j").state is JobState.READY
    (lease,) = spool.claim()
    assert spool.complete(lease).state is JobState.COMPLETED


def test_reopening_a_canceled_job_with_another_kind_never_mixes_kind_and_payload(
    spool: Spool,
) -> None:
    spool.enqueue("email", {"to": "a@example.org"}, job_id="j")
    spool.cancel("j")
    job = spool.enqueue("sms", {"phone": "+100"}, job_id="j")
    # The new kind with the new payload, or the old job as it was: an sms payload
    # handed to the email handler is neither.
    assert (job.kind, job.payload) in [("sms", {"phone": "+100"}),
                                       ("email", {"to": "a@example.org"})]
    assert spool.get("j") == job


def test_enqueue_writes_its_files_before_taking_the_lock(spool: Spool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating inodes is an enqueue's costly part; other processes must not wait for it."""
    held_while_staging: list[bool] = []
    real = spool.store.prestage

    def prestage(datas: Any) -> Any:
        held_while_staging.append(spool.lock.held)
        return real(datas)

    monkeypatch.setattr(spool.store, "prestage", prestage)
    jobs = spool.enqueue_many("note", [{"i": i} for i in range(20)])
    assert held_while_staging == [False]
    assert sorted(p.name for p in (spool.root / "ready").iterdir()) == sorted(
        f"{j.id}.json" for j in jobs)
    assert [p.name for p in (spool.root / "tmp").iterdir() if p.name != "pool"] == []


def test_an_idempotent_enqueue_leaves_no_staged_file_behind(spool: Spool) -> None:
    spool.enqueue("note", {"v": 1}, job_id="same")
    again = spool.enqueue("note", {"v": 2}, job_id="same")
    assert again.payload == {"v": 1}
    assert [p.name for p in (spool.root / "tmp").iterdir() if p.name != "pool"] == []
