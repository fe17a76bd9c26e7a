"""Schedules on paths a probe found: a rule change followed by downtime, a catch-up
longer than `max_catch_up`, and a clock set past the year 9999."""

from __future__ import annotations

import logging
import threading

import pytest

from jobspool import App, Schedule, Spool, Worker
from jobspool.schedules import Scheduler
from tests.spools import make_spool

HOUR = 3600
DAY = 24 * HOUR
T0 = 1_800_000_000 - 1_800_000_000 % DAY  # a midnight UTC
_YEAR_9999_END = 253_402_300_000.0  # 9999-12-31T23:46:40Z


def _fired(result: list) -> list[int]:  # type: ignore[type-arg]
    return [t for f in result for t in f.ticks]


def test_catch_up_all_after_a_rule_change_then_downtime_fires_each_missed_tick(
        spool: Spool) -> None:
    # every 60 s became every 3600 s at 10:06, after the old rule's 10:05 tick; the workers
    # were then down until 15:10. The floor kept for the new rule (10:05, no tick of it)
    # was taken for a second rule change at 15:10, and "all" fired 15:00 alone.
    old = Schedule("k.x", every=60, catch_up="all")
    new = Schedule("k.x", every=HOUR, catch_up="all")
    assert _fired(Scheduler([old]).tick(spool, T0 + 10 * HOUR + 5 * 60 + 1)) == \
        [T0 + 10 * HOUR + 5 * 60]
    assert Scheduler([new]).tick(spool, T0 + 10 * HOUR + 6 * 60) == []
    assert _fired(Scheduler([new]).tick(spool, T0 + 15 * HOUR + 10 * 60)) == \
        [T0 + h * HOUR for h in range(11, 16)]


def test_status_after_a_rule_change_does_not_list_the_old_rules_tick(spool: Spool) -> None:
    # 04:00 fired, then the rule became 03:00: the mark kept as the new rule's floor (the
    # old 04:00 tick, later than the new rule's latest) was listed as the new rule's last.
    Scheduler([Schedule("k.x", cron="0 4 * * *")]).tick(spool, T0 + 4 * HOUR + 5)
    new = Scheduler([Schedule("k.x", cron="0 3 * * *")])
    assert new.tick(spool, T0 + 10 * HOUR) == []
    (row,) = new.status(spool, T0 + 10 * HOUR)
    assert row["last_tick"] is None and row["last_job_id"] is None
    assert row["next_tick"] == T0 + DAY + 3 * HOUR
    _fired(new.tick(spool, T0 + DAY + 3 * HOUR + 1))
    (row,) = new.status(spool, T0 + DAY + 3 * HOUR + 2)
    assert row["last_tick"] == T0 + DAY + 3 * HOUR and row["last_job_state"] == "ready"


def test_catch_up_all_past_max_catch_up_names_the_ticks_it_skips(
        spool: Spool, caplog: pytest.LogCaptureFixture) -> None:
    scheduler = Scheduler([Schedule("k.x", every=60, catch_up="all", max_catch_up=3)])
    scheduler.tick(spool, T0 + 1)
    caplog.set_level(logging.WARNING, logger="jobspool")
    assert _fired(scheduler.tick(spool, T0 + HOUR + 1)) == [T0 + HOUR - 120 + 60 * k
                                                            for k in range(3)]
    (line,) = [r.getMessage() for r in caplog.records if "max_catch_up" in r.getMessage()]
    assert "more than max_catch_up=3 ticks were missed" in line and "k.x" in line
    caplog.clear()
    # Exactly max_catch_up missed: nothing skipped, nothing to say.
    assert len(_fired(scheduler.tick(spool, T0 + HOUR + 181))) == 3
    assert not [r for r in caplog.records if "max_catch_up" in r.getMessage()]


def test_a_clock_past_the_year_9999_neither_stops_the_worker_nor_the_status(
        tmp_path: object) -> None:
    # The next daily tick lies past 9999-12-31: computing it raised OverflowError outside
    # the firing loop's guard, and the worker's task group died with it.
    daily = Schedule("k.d", cron="0 0 * * *")
    assert Scheduler([daily]).next_wake(_YEAR_9999_END) == float("inf")
    ran = threading.Event()
    with make_spool(tmp_path / "spool", clock=lambda: _YEAR_9999_END) as spool:  # type: ignore[operator]
        (row,) = Scheduler([daily]).status(spool)
        assert row["next_tick"] is None and row["next_tick_iso"] is None
        app = App(handlers={"k.d": lambda job, ctx: None,
                            "k.work": lambda job, ctx: ran.set()},
                  schedules=[daily])
        worker = Worker(spool, app, maintenance=False)
        job = spool.enqueue("k.work", {})
        thread = threading.Thread(target=lambda: worker.run_forever(handle_signals=False,
                                                                    poll_seconds=0.01))
        thread.start()
        try:
            assert ran.wait(30)
        finally:
            worker.stop()
            thread.join(30)
        assert not thread.is_alive()
        assert spool.get(job.id).state.value == "completed"
