"""Writer backpressure: refused over the limit, admitted again under half of it (hysteresis)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobspool import Spool
from jobspool.errors import Backpressure, JobspoolError
from jobspool.queue.backpressure import CACHE_SECONDS, is_on
from tests.conftest import FakeClock
from tests.spools import make_spool


def ready(root: Path) -> int:
    return sum(1 for n in (root / "ready").iterdir() if n.name.endswith(".json"))


@pytest.fixture
def bounded(spool_root: Path, clock: FakeClock) -> Iterator[Spool]:
    s = make_spool(spool_root, clock=clock, max_due=10)
    yield s
    s.close()


def drain(spool: Spool, n: int) -> None:
    for lease in spool.claim(limit=n):
        spool.complete(lease)


def test_without_limits_nothing_is_ever_refused(spool_root: Path, clock: FakeClock) -> None:
    with make_spool(spool_root, clock=clock) as s:
        s.enqueue_many("k", range(200))
        s.enqueue("k")
        assert ready(spool_root) == 201


def test_max_due_refuses_the_job_that_would_go_over_and_writes_nothing(
        bounded: Spool, spool_root: Path) -> None:
    for i in range(10):
        bounded.enqueue("k", i)
    with pytest.raises(Backpressure) as info:
        bounded.enqueue("k", 10)
    err = info.value
    assert err.limit == "max_due" and err.value == 10
    assert "max_due=10" in str(err) and "retry later" in str(err)
    assert isinstance(err, JobspoolError)
    assert pickle.loads(pickle.dumps(err)).limit == "max_due"  # crosses processes intact
    assert ready(spool_root) == 10
    assert is_on(bounded.journal)


def test_refused_until_the_backlog_is_under_half_of_max_due(
        bounded: Spool, spool_root: Path) -> None:
    bounded.enqueue_many("k", range(10))
    with pytest.raises(Backpressure):
        bounded.enqueue("k")
    drain(bounded, 4)  # 6 left: under the limit but not under half of it
    with pytest.raises(Backpressure, match="not yet under half"):
        bounded.enqueue("k")
    drain(bounded, 1)  # 5 left: exactly half is not under half
    with pytest.raises(Backpressure):
        bounded.enqueue("k")
    drain(bounded, 1)  # 4 left: admitted again
    bounded.enqueue("k")
    assert not is_on(bounded.journal)
    # Released: the ordinary limit applies again, up to max_due.
    bounded.enqueue_many("k", range(5))
    assert ready(spool_root) == 10
    with pytest.raises(Backpressure):
        bounded.enqueue("k")


def test_a_batch_that_would_go_over_is_refused_whole(bounded: Spool, spool_root: Path) -> None:
    bounded.enqueue_many("k", range(8))
    with pytest.raises(Backpressure):
        bounded.enqueue_many("k", range(3))
    assert ready(spool_root) == 8
    drain(bounded, 8)
    bounded.enqueue_many("k", range(2))
    assert ready(spool_root) == 2


def test_a_batch_larger_than_the_limit_still_enters_an_empty_backlog(
        bounded: Spool, spool_root: Path) -> None:
    bounded.enqueue_many("k", range(25))
    assert ready(spool_root) == 25
    with pytest.raises(Backpressure):
        bounded.enqueue("k")


def test_prepare_is_refused_like_enqueue(bounded: Spool, spool_root: Path) -> None:
    bounded.enqueue_many("k", range(10))
    with pytest.raises(Backpressure):
        bounded.prepare("k")
    assert not any((spool_root / "prepared").iterdir())


def test_max_lag_refuses_while_the_oldest_ready_job_waits_too_long(
        spool_root: Path, clock: FakeClock) -> None:
    with make_spool(spool_root, clock=clock, max_lag_seconds=60.0) as s:
        first = s.enqueue("k")
        clock.advance(20.0)
        s.enqueue("k")
        clock.advance(40.0)
        s.enqueue("k")  # the oldest has waited exactly 60 s: not over
        clock.advance(1.0)
        with pytest.raises(Backpressure) as info:
            s.enqueue("k")
        assert info.value.limit == "max_lag_seconds"
        assert info.value.value == pytest.approx(61.0)
        assert "max_lag_seconds=60" in str(info.value)

        (lease,) = s.claim()
        assert lease.job_id == first.id
        s.complete(lease)  # the oldest is now 41 s old: under the limit, not under half
        with pytest.raises(Backpressure, match="not yet under half"):
            s.enqueue("k")
        for lease in s.claim(limit=1):
            s.complete(lease)  # the oldest is now 1 s old
        s.enqueue("k")
        assert not is_on(s.journal)


def test_both_limits_together_name_the_one_that_tripped(spool_root: Path, clock: FakeClock) -> None:
    with make_spool(spool_root, clock=clock, max_due=100, max_lag_seconds=5.0) as s:
        s.enqueue("k")
        clock.advance(6.0)
        with pytest.raises(Backpressure) as info:
            s.enqueue("k")
        assert info.value.limit == "max_lag_seconds"


def test_a_refusal_is_always_decided_on_a_fresh_count(bounded: Spool, spool_root: Path) -> None:
    # The clock stands still, so the cached count (plus our own admissions) says 10;
    # a claim drained half of them meanwhile and the refusal check re-counts.
    bounded.enqueue_many("k", range(10))
    drain(bounded, 5)
    bounded.enqueue_many("k", range(5))
    assert ready(spool_root) == 10


def test_other_producers_are_seen_once_the_cache_window_passes(
        spool_root: Path, clock: FakeClock) -> None:
    # The documented trade-off: for CACHE_SECONDS of the spool clock, a producer counts
    # its own admissions on top of its last listing, not what other producers added.
    with make_spool(spool_root, clock=clock, max_due=10) as mine, \
            make_spool(spool_root, clock=clock) as other:
        mine.enqueue("k")
        other.enqueue_many("k", range(10))
        mine.enqueue("k")  # within the window: 2 by our count, admitted
        assert ready(spool_root) == 12
        clock.advance(CACHE_SECONDS)
        with pytest.raises(Backpressure) as info:
            mine.enqueue("k")
        assert info.value.value == 12


def test_limits_must_be_positive(spool_root: Path) -> None:
    with pytest.raises(JobspoolError, match="max_due"):
        make_spool(spool_root, max_due=0)
    with pytest.raises(JobspoolError, match="max_lag_seconds"):
        make_spool(spool_root, max_lag_seconds=-1.0)


def test_a_refused_enqueue_leaves_no_staged_file_behind(tmp_path: Path) -> None:
    spool = make_spool(tmp_path / "s", max_due=2)
    spool.enqueue_many("k", [1, 2])
    with pytest.raises(Backpressure):
        spool.enqueue_many("k", [3, 4, 5])
    assert [p.name for p in (tmp_path / "s" / "tmp").iterdir() if p.name != "pool"] == []
    spool.close()
