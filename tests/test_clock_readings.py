"""An injected clock's readings become the jobs' times: a bad one is refused, never written.

A clock returning NaN, an infinity, milliseconds or a non-number had every write succeed
and the jobs it touched (a valid job it claimed included) turn unreadable, to be
quarantined by `recover`. A retry backoff of 1e12 s did the same to every failed job.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from jobspool import JobState, Policy, Spool
from jobspool.errors import InvalidJob, PolicyError
from jobspool.queue.payload import MAX_RUN_AT

BAD_READINGS = [math.nan, math.inf, -math.inf, 1e300, 1.7e12, -5.0, "1700000000", None, True]


def ids_on_disk(root: Path) -> dict[str, list[str]]:
    return {d.name: sorted(p.name for p in d.glob("*.json"))
            for d in sorted(root.iterdir()) if d.is_dir() and d.name in {s.value for s in JobState}}


@pytest.mark.parametrize("reading", BAD_READINGS, ids=repr)
def test_a_bad_clock_reading_is_refused_and_nothing_is_written(
        make_any_spool: Callable[..., Spool], reading: object) -> None:
    good = make_any_spool()
    good.enqueue("k", {"n": 1}, job_id="good")
    bad = make_any_spool(clock=lambda: reading)
    for attempt in (lambda: bad.enqueue("k", None, job_id="new"), lambda: bad.claim(),
                    lambda: bad.cancel("good")):
        with pytest.raises(InvalidJob, match="clock") as caught:
            attempt()
        assert "\n" not in str(caught.value)
        assert caught.value.field == "clock"
    job = good.get("good")  # untouched, readable, still due
    assert job.state is JobState.READY and job.revision == 1 and job.lease is None
    assert [j.id for j in good.jobs()] == ["good"]


def test_milliseconds_are_named_as_the_likely_slip(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", durable=False, clock=lambda: 1_764_000_000_000.0)
    with pytest.raises(InvalidJob, match=r"milliseconds"):
        spool.enqueue("k")


def test_a_clock_that_raises_is_reported_as_the_clock(tmp_path: Path) -> None:
    def ntp_down() -> float:
        raise RuntimeError("ntp down")

    spool = Spool(tmp_path / "s", durable=False, clock=ntp_down)
    with pytest.raises(InvalidJob, match=r"clock \(.*ntp_down\) raised RuntimeError: ntp down"):
        spool.enqueue("k")
    assert ids_on_disk(tmp_path / "s")["ready"] == []


def test_good_readings_of_any_real_type_are_taken(tmp_path: Path) -> None:
    from fractions import Fraction

    for reading in (1_000, 1_000.5, Fraction(2001, 2), 0):
        spool = Spool(tmp_path / f"s{reading!s}".replace("/", "_"), durable=False,
                      clock=lambda r=reading: r)
        job = spool.enqueue("k")
        assert job.created_at == float(reading) and isinstance(job.created_at, float)
        spool.close()


@pytest.mark.parametrize("name", ["retry_base_seconds", "retry_max_seconds"])
def test_a_backoff_past_the_year_9999_is_refused_up_front(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidJob, match=f"{name}.*year 9999"):
        Spool(tmp_path / "s", **{name: 1e12})
    assert not (tmp_path / "s").exists()  # refused before anything is created
    with pytest.raises(PolicyError, match=f"{name}.*year 9999"):
        Policy(**{name: 1e12})
    Policy(timeout=1e12)  # a time limit is never written as a time: no bound


def test_a_retry_near_the_end_of_time_stays_readable(tmp_path: Path) -> None:
    """Settings are checked against the machine's clock; the backoff is added to the spool's,
    and capped there, so a failed job is always a file every reader takes."""
    now = MAX_RUN_AT - 100
    spool = Spool(tmp_path / "s", durable=False, clock=lambda: now, lease_seconds=30,
                  retry_base_seconds=3600, retry_max_seconds=3600)
    spool.enqueue("k", job_id="late")
    (lease,) = spool.claim()
    failed = spool.fail(lease, "boom")
    assert failed.state is JobState.RETRYABLE and failed.run_at == MAX_RUN_AT
    reopened = Spool(tmp_path / "s", durable=False)
    assert reopened.get("late").run_at == MAX_RUN_AT  # read back, not skipped as corrupt
    assert reopened.recover().quarantined == ()


def test_a_clock_stepping_back_past_a_due_retry_does_not_hang_the_claim(
        make_any_spool: Callable[..., Spool]) -> None:
    """Found by a parity probe: on the file store, a retry the claim index had seen due
    was handed out again after the clock stepped back (NTP, a resumed VM); the claim found
    it not due, learned it, got it back, for ever, at 100% CPU holding the spool lock
    (every other process's enqueue and stats blocked behind it). PostgreSQL returned []."""
    import threading

    offset = [0.0]
    base = 1_800_000_000.0
    spool = make_any_spool(clock=lambda: base + offset[0])
    spool.enqueue("k", "a", job_id="a")
    spool.enqueue("k", "r", job_id="r", delay=5, priority=1)
    offset[0] = 10.0  # ahead: the retry is due, and the index learns so
    assert [lease.job_id for lease in spool.claim(kinds="k", limit=1)] == ["a"]
    offset[0] = 0.0  # the clock steps back 10 s: the retry is not due again
    got: list[object] = []

    def claim() -> None:
        try:
            got.append([lease.job_id for lease in spool.claim(kinds="k", limit=1)])
        except BaseException as exc:  # the test reports it
            got.append(exc)
    thread = threading.Thread(target=claim, daemon=True)
    thread.start()
    thread.join(60)  # a hang guard: the claim spun for ever before
    assert not thread.is_alive(), "the claim is still spinning"
    assert got == [[]]
    offset[0] = 6.0  # due again: claimed
    assert [lease.job_id for lease in spool.claim(kinds="k", limit=1)] == ["r"]
