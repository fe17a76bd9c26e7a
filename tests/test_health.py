"""`check_health`: every reason is raised by a spool built for it, and cleared once fixed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from jobspool import Spool
from jobspool.health import Health, Reason, check_health
from jobspool.projection.maintenance import TableOutcome, _save_state, read_maintenance_state
from tests.conftest import FakeClock
from tests.spools import make_spool


@pytest.fixture
def spool(spool_root: Path, clock: FakeClock) -> Iterator[Spool]:
    s = make_spool(spool_root, clock=clock, lease_seconds=30.0, max_attempts=10,
              prepare_grace_seconds=60.0)
    yield s
    s.close()


def codes(spool: Spool, **kwargs: object) -> list[str]:
    return check_health(spool, **kwargs).codes()  # type: ignore[arg-type]


def test_fresh_spool_is_ok_with_no_reasons(spool: Spool) -> None:
    health = check_health(spool)
    assert health.ok and health.status == "ok" and health.reasons == []
    assert health.to_dict()["status"] == "ok"
    assert health.text().startswith("ok")


def test_dead_letters_degrade_until_requeued(spool: Spool) -> None:
    job = spool.enqueue("mail", {"to": "x"})
    (lease,) = spool.claim()
    spool.fail(lease, "smtp said no", retryable=False)

    health = check_health(spool)
    assert not health.ok and health.status == "degraded"
    (reason,) = health.reasons
    assert reason.code == "dead_letters" and reason.value == 1
    assert "jobspool list --state dead_letter" in reason.message

    spool.requeue(job.id)
    assert check_health(spool).ok


def test_old_due_job_means_the_queue_is_not_draining(spool: Spool, clock: FakeClock) -> None:
    spool.enqueue("mail")
    clock.advance(300.0)
    assert codes(spool) == []  # exactly at the bound: still fine
    clock.advance(1.0)
    health = check_health(spool)
    assert health.codes() == ["queue_not_draining"]
    assert health.reasons[0].value == pytest.approx(301.0)
    assert "stats --by-kind" in health.reasons[0].message
    assert codes(spool, max_due_age=600.0) == []  # the bound is the caller's

    (lease,) = spool.claim()
    spool.complete(lease)
    assert codes(spool) == []


def test_old_due_retry_counts_as_not_draining(spool: Spool, clock: FakeClock) -> None:
    spool.enqueue("mail", delay=10.0)
    clock.advance(10.0 + 301.0)
    assert codes(spool) == ["queue_not_draining"]


def test_expired_unreclaimed_lease_degrades_until_recovered(spool: Spool, clock: FakeClock) -> None:
    job = spool.enqueue("mail")
    spool.claim()
    clock.advance(29.0)
    assert codes(spool) == []  # lease still live
    clock.advance(1.0)
    health = check_health(spool)
    assert health.codes() == ["expired_leases"]
    assert job.id in health.reasons[0].message and "jobspool recover" in health.reasons[0].message
    assert codes(spool, lease_grace=5.0) == []  # a grace tolerates a worker about to reclaim

    report = spool.recover()
    assert job.id in report.leases_reclaimed
    assert codes(spool) == []
    assert spool.get(job.id).rescues == 1


def test_expired_lease_cleared_when_a_worker_reclaims_it(spool: Spool, clock: FakeClock) -> None:
    job = spool.enqueue("mail")
    spool.claim()
    clock.advance(31.0)
    assert codes(spool) == ["expired_leases"]
    (lease,) = spool.claim()
    assert lease.job_id == job.id
    assert codes(spool) == []


def test_prepared_job_past_the_replay_grace_degrades_until_committed(
        spool: Spool, clock: FakeClock) -> None:
    reservation = spool.prepare("mail", {"n": 1})
    clock.advance(59.0)
    assert codes(spool) == []
    clock.advance(1.0)  # updated_at <= now - grace: the rule recovery replays by
    health = check_health(spool)
    assert health.codes() == ["stale_prepared"]
    assert reservation.job_id in health.reasons[0].message
    assert "60 s" in health.reasons[0].message

    spool.commit(reservation)
    assert codes(spool) == []


def test_quarantined_files_degrade_until_removed(spool: Spool, spool_root: Path) -> None:
    (spool_root / "ready" / "garbage.json").write_bytes(b"{not json")
    report = spool.recover()
    assert len(report.quarantined) == 1

    health = check_health(spool)
    assert health.codes() == ["quarantined_files"]
    assert str(spool_root / "quarantine") in health.reasons[0].message

    for name in os.listdir(spool_root / "quarantine"):
        os.unlink(spool_root / "quarantine" / name)
    assert codes(spool) == []


def test_several_reasons_are_all_reported_in_a_stable_order(
        spool: Spool, clock: FakeClock, spool_root: Path) -> None:
    spool.enqueue("a")
    spool.prepare("b")
    spool.enqueue("c", job_id="c1")
    (lease,) = spool.claim(kinds="c")
    spool.fail(lease, "nope", retryable=False)
    spool.enqueue("d")
    spool.claim(kinds="d")
    clock.advance(400.0)
    assert codes(spool) == ["dead_letters", "queue_not_draining", "expired_leases",
                            "stale_prepared"]


def test_health_document_and_text_name_each_reason(spool: Spool, clock: FakeClock) -> None:
    spool.enqueue("mail")
    clock.advance(1000.0)
    health = check_health(spool)
    doc = orjson.loads(orjson.dumps(health.to_dict()))
    assert doc["status"] == "degraded" and doc["ok"] is False
    assert doc["reasons"][0]["code"] == "queue_not_draining"
    assert doc["figures"]["due"] == 1
    text = health.text()
    assert text.startswith("degraded") and "[queue_not_draining]" in text


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_bound_that_is_not_positive_is_refused(spool: Spool, bad: float) -> None:
    with pytest.raises(ValueError, match="max_due_age"):
        check_health(spool, max_due_age=bad)


def test_health_is_a_frozen_record() -> None:
    h = Health([Reason("dead_letters", "m", 1)])
    with pytest.raises(AttributeError):
        h.reasons = []  # type: ignore[misc]
    assert not h.ok


# ---------------------------------------------------------------- projection maintenance


def record(uri: Path, now: float, *outcomes: tuple[str, str, str]) -> None:
    """Record maintenance outcomes through maintenance's own state writer (into a
    projection directory, which maintenance never creates)."""
    uri.mkdir(parents=True, exist_ok=True)
    for table, outcome, reason in outcomes:
        _save_state(str(uri), [TableOutcome(table, outcome, reason)],  # type: ignore[arg-type]
                    None, now, touch_resume=False)


@pytest.fixture
def index(spool_root: Path) -> Path:
    path = spool_root / "index"
    path.mkdir()
    return path


def test_repeated_optimize_failures_degrade_until_one_succeeds(
        spool: Spool, clock: FakeClock, index: Path) -> None:
    now = clock.now
    record(index, now, ("notes", "optimized", "compacted"))
    record(index, now, ("notes", "failed", "disk full"), ("notes", "failed", "disk full"))
    assert codes(spool) == []  # two in a row: under the bound of three
    record(index, now, ("notes", "failed", "disk full"))
    health = check_health(spool)  # <root>/index is the default projection
    assert health.codes() == ["maintenance_failing"]
    assert "'notes'" in health.reasons[0].message and "disk full" in health.reasons[0].message
    assert health.reasons[0].value == 3
    assert codes(spool, max_maintenance_failures=4) == []

    record(index, now, ("notes", "optimized", "compacted"))
    assert codes(spool) == []


def test_lost_commit_races_are_not_failures(spool: Spool, clock: FakeClock, index: Path) -> None:
    record(index, clock.now, ("notes", "optimized", "compacted"))
    for _ in range(10):
        record(index, clock.now, ("notes", "deferred", "lost a commit race, retried next run"))
    assert read_maintenance_state(index)["tables"]["notes"]["consecutive_failures"] == 0
    assert codes(spool) == []


def test_no_successful_maintenance_for_three_cadences_degrades(
        spool: Spool, clock: FakeClock, index: Path) -> None:
    start = clock.now
    record(index, start, ("notes", "optimized", "compacted"))
    clock.advance(200.0)
    record(index, clock.now, ("notes", "deferred", "lost a commit race, retried next run"))
    assert codes(spool, maintenance_cadence=60.0) == ["maintenance_stale"]
    health = check_health(spool, maintenance_cadence=60.0)
    assert health.reasons[0].value == pytest.approx(200.0)
    assert "3x the 60 s cadence" in health.reasons[0].message
    assert codes(spool, maintenance_cadence=100.0) == []  # 200 s is under 3x 100 s

    record(index, clock.now, ("notes", "optimized", "compacted"))
    assert codes(spool, maintenance_cadence=60.0) == []


def test_idle_table_left_unchanged_is_not_stale(spool: Spool, clock: FakeClock, index: Path) -> None:
    record(index, clock.now, ("notes", "optimized", "compacted"))
    clock.advance(3600.0)  # no writes: nothing to maintain, skipping is success
    record(index, clock.now, ("notes", "skipped", "unchanged since the last maintenance"))
    assert codes(spool) == []


def test_explicit_projection_uri_is_read_and_default_needs_the_directory(
        spool: Spool, clock: FakeClock, tmp_path: Path, spool_root: Path) -> None:
    elsewhere = tmp_path / "lance"
    record(elsewhere, clock.now, *[("t", "failed", "boom")] * 3)
    assert codes(spool) == []  # <root>/index does not exist: no projection checked
    assert codes(spool, projection=str(elsewhere)) == ["maintenance_failing"]
    assert check_health(spool, projection=str(elsewhere)).figures["projection"] == str(elsewhere)
    assert codes(spool, projection="s3://bucket/db") == []  # remote: no local state to read
    # A mistyped local path is said, not read as "nothing to report".
    assert codes(spool, projection=str(tmp_path / "typo")) == ["projection_not_found"]
    (tmp_path / "afile").write_text("x")
    assert codes(spool, projection=str(tmp_path / "afile")) == ["projection_not_found"]


def test_an_unreadable_leased_file_is_skipped_with_a_warning_not_a_crash(
        spool: Spool, spool_root: Path) -> None:
    from jobspool.errors import CorruptFileWarning

    (spool_root / "leased" / "broken.json").write_bytes(b"\x00garbage")
    with pytest.warns(CorruptFileWarning):
        health = check_health(spool)
    assert health.codes() == ["unreadable_files"]  # no crash; the file is named
    assert "leased/broken.json" in health.reasons[0].message


def test_a_table_always_deferred_since_its_first_attempt_goes_stale(
        spool: Spool, clock: FakeClock, index: Path) -> None:
    start = clock.now
    record(index, start, ("notes", "deferred", "lost a commit race, retried next run"))
    clock.advance(200.0)
    record(index, clock.now, ("notes", "deferred", "lost a commit race, retried next run"))
    assert read_maintenance_state(index)["tables"]["notes"]["first_attempt"] == start
    health = check_health(spool, maintenance_cadence=60.0)
    assert health.codes() == ["maintenance_stale"]
    assert health.reasons[0].value == pytest.approx(200.0)
    assert codes(spool, maintenance_cadence=100.0) == []  # 200 s is under 3x 100 s


def test_a_deleted_fence_file_is_a_health_reason(tmp_path: Path) -> None:
    """fsck named a deleted fence file and health said ok (a hand-damage probe; a garbled
    one fails `stats`, and so health, in one line naming recover)."""
    said = "is missing"
    root = tmp_path / "spool"
    make_spool(root).close()
    (root / "fence").unlink()
    with make_spool(root, read_only=True) as spool:
        health = check_health(spool)
    assert "fence_unreadable" in health.codes()
    (reason,) = [r for r in health.reasons if r.code == "fence_unreadable"]
    assert said in reason.message and "jobspool recover" in reason.message
    with make_spool(root) as spool:
        spool.recover()
    with make_spool(root, read_only=True) as spool:
        assert "fence_unreadable" not in check_health(spool).codes()
