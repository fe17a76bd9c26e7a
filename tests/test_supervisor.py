"""`Supervisor` (queue/supervisor.py): a failure of the worker's own machinery is logged,
counted, backed off from, and given up on past `max_crashes` within the window."""

from __future__ import annotations

import logging

import anyio
import pytest

from jobspool.errors import SpoolError, WorkerCrashed
from jobspool.queue.report import Counters
from jobspool.queue.supervisor import MAX_BACKOFF_SECONDS, Supervisor


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_gives_up_on_the_max_crashes_th_failure_within_the_window() -> None:
    ticks = Ticks()
    sup = Supervisor(max_crashes=3, crash_window_seconds=60.0, clock=ticks)
    counters = Counters()
    assert sup.record(OSError("disk"), counters) is None
    ticks.now = 10.0
    assert sup.record(OSError("disk"), counters) is None
    ticks.now = 20.0
    verdict = sup.record(SpoolError("lock lost"), counters)
    assert isinstance(verdict, WorkerCrashed)
    assert str(verdict) == ("worker loop failed 3 times within 60 s; "
                            "last: SpoolError: lock lost")
    assert counters.crashes == 3


def test_failures_older_than_the_window_are_forgotten() -> None:
    ticks = Ticks()
    sup = Supervisor(max_crashes=2, crash_window_seconds=5.0, clock=ticks)
    counters = Counters()
    assert sup.record(OSError("a"), counters) is None
    ticks.now = 6.0
    assert sup.record(OSError("b"), counters) is None
    assert sup.recent == 1
    ticks.now = 7.0
    assert isinstance(sup.record(OSError("c"), counters), WorkerCrashed)
    assert counters.crashes == 3  # every failure counts in the run's report


def test_the_backoff_doubles_from_a_tenth_of_a_second_up_to_its_cap() -> None:
    assert [Supervisor.backoff_seconds(n) for n in (1, 2, 3, 4)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8])
    assert Supervisor.backoff_seconds(50) == MAX_BACKOFF_SECONDS


def test_an_expected_failure_is_one_log_line_and_a_bug_of_ours_keeps_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor(max_crashes=10)
    with caplog.at_level(logging.ERROR, logger="jobspool.queue.worker"):
        sup.record(OSError(5, "EIO"), Counters())
        sup.record(KeyError("oops"), Counters())
    expected, bug = caplog.records
    assert "worker loop failed (OSError" in expected.getMessage() and expected.exc_info is None
    assert "worker loop failed (KeyError" in bug.getMessage() and bug.exc_info is not None


def test_failed_backs_off_until_a_stop_then_returns_the_verdict_when_giving_up() -> None:
    stopped = False
    sup = Supervisor(max_crashes=2, crash_window_seconds=60.0, stopping=lambda: stopped)
    counters = Counters()

    async def main() -> tuple[WorkerCrashed | None, WorkerCrashed | None]:
        nonlocal stopped
        stopped = True  # a stop cuts the backoff short: the first call returns at once
        first = await sup.failed(OSError("a"), counters)
        second = await sup.failed(OSError("b"), counters)
        return first, second

    first, second = anyio.run(main)
    assert first is None
    assert isinstance(second, WorkerCrashed) and "failed 2 times" in str(second)


def test_an_outage_is_logged_from_when_the_store_first_failed(
        caplog: pytest.LogCaptureFixture) -> None:
    # Found probing the PostgreSQL store: a 41 s outage was logged as "reachable again
    # after 13 s": the store's own retries (reconnect_seconds, 30 s) were left out.
    from jobspool.errors import StoreUnavailable

    ticks = Ticks()
    sup = Supervisor(clock=ticks)
    ticks.now = 100.0
    down = StoreUnavailable("database x unavailable during claiming: server closed")
    down.down_for = 30.0
    with caplog.at_level(logging.WARNING, logger="jobspool.queue.worker"):
        assert sup.record(down, Counters()) is None
        ticks.now = 111.0
        sup.reached()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("store unavailable for 30 s (database x"), lines
    assert lines[-1] == "store reachable again after 41 s", lines
