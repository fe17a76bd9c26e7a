"""Schedule marks on both stores: a clock that jumped ahead and came back, a rule changed
under the same name, and (PostgreSQL) a host clock stepped after the spool was opened.

Found by a time probe. On PostgreSQL a mark was only ever moved forward, so the mark a
jumped clock left stayed in the future: every later tick was a first sight, and catch-up
fired only the latest tick after each downtime (the file store started over at once). On
both stores, making a rule finer under the same name (hourly to every minute) fired a burst
of "missed" ticks when the old mark was a tick of both rules. And a PostgreSQL spool
corrected the host's clock by an offset measured once: after the host clock stepped +2 h,
its jobs were due 2 h late and its schedules fired 2 h early."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from jobspool import Schedule, Spool
from jobspool.schedules import Scheduler

MINUTE, HOUR, DAY = 60, 3600, 86400


def _fired(scheduler: Scheduler, spool: Spool, at: float) -> list[int]:
    return [t for f in scheduler.tick(spool, at) for t in f.ticks]


def test_catch_up_works_again_once_a_clock_that_jumped_ahead_is_back(
        any_spool: Spool) -> None:
    t = (int(time.time()) // MINUTE) * MINUTE
    scheduler = Scheduler([Schedule("tick", every=MINUTE, catch_up="all")])
    assert _fired(scheduler, any_spool, t + 1) == [t]
    _fired(scheduler, any_spool, t + 2 * DAY)  # one process with a clock two days ahead
    assert _fired(scheduler, any_spool, t + 2 * MINUTE + 1) == [t + 2 * MINUTE]  # corrected
    # Seven minutes down: catch_up="all" fires each tick missed.
    fired = _fired(scheduler, any_spool, t + 9 * MINUTE + 1)
    assert fired == [t + m * MINUTE for m in range(3, 10)]


@pytest.mark.parametrize(("old", "new"), [
    ({"every": HOUR}, {"every": MINUTE}),
    ({"cron": "0 * * * *"}, {"cron": "* * * * *"}),
], ids=["every", "cron"])
def test_a_rule_made_finer_under_its_name_starts_over_instead_of_catching_up(
        any_spool: Spool, old: dict[str, object], new: dict[str, object]) -> None:
    hour = (int(time.time()) // HOUR) * HOUR
    before = Scheduler([Schedule("tick", catch_up="all", **old)])  # type: ignore[arg-type]
    assert _fired(before, any_spool, hour + 1) == [hour]
    # Redeployed 50 minutes later with a finer rule; the old mark (a whole hour) is a tick
    # of the new rule too. No downtime happened: nothing is owed.
    after = Scheduler([Schedule("tick", catch_up="all", **new)])  # type: ignore[arg-type]
    at = hour + 50 * MINUTE + 1
    assert _fired(after, any_spool, at) == [hour + 50 * MINUTE]  # first sight: the tick now
    assert _fired(after, any_spool, at + MINUTE) == [hour + 51 * MINUTE]
    assert _fired(before, any_spool, hour + HOUR + 1) == [hour + HOUR]  # and back again
    assert any_spool.stats().counts["ready"] == 4


@pytest.fixture
def stepped_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[float], None]]:
    real = time.time
    step = [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + step[0])

    def set_step(seconds: float) -> None:
        step[0] = seconds
    yield set_step


def test_a_pg_spool_keeps_the_databases_time_when_the_host_clock_steps(
        pg_url: str, stepped_clock: Callable[[float], None]) -> None:
    with Spool(pg_url) as spool:
        stepped_clock(2 * HOUR)  # NTP or an operator stepped this host's clock
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        assert abs(spool.now() - row[0]) < 60, (spool.now() - row[0])
        job = spool.enqueue("k", {})
        assert [lease.job_id for lease in spool.claim(kinds="k")] == [job.id]  # due now
        fired = Scheduler([Schedule("tick", every=HOUR)]).tick(spool)
        assert all(t <= row[0] + 60 for f in fired for t in f.ticks)  # none 2 h early


# Found by a schedules probe: a rule edited while the workers were down, even only in how
# it is written, was taken for a new rule, and a new rule's first sight fired nothing, so
# catch_up="once" and "all" fired no job for two days of missed 03:00 runs.
@pytest.mark.parametrize("written", ["0  3 * * *", "0 3 * * 0-6", "0 3 1-31 * 0-6",
                                     " 0 3 * * * ", "@daily"])
def test_a_cron_rule_written_another_way_still_catches_up(any_spool: Spool,
                                                          written: str) -> None:
    day = (int(time.time()) // DAY - 3) * DAY
    at = 0 if written != "@daily" else 3 * HOUR  # @daily is 00:00, not 03:00
    rule = "0 3 * * *" if written != "@daily" else "0 0 * * *"
    before = Scheduler([Schedule("nightly", cron=rule, catch_up="all")])
    assert _fired(before, any_spool, day + 3 * HOUR + 1 - at) == [day + 3 * HOUR - at]
    after = Scheduler([Schedule("nightly", cron=written, catch_up="all")])
    # Two days down, restarted at 10:00 with the schedule written another way.
    assert _fired(after, any_spool, day + 2 * DAY + 10 * HOUR) == \
        [day + DAY + 3 * HOUR - at, day + 2 * DAY + 3 * HOUR - at]


@pytest.mark.parametrize(("catch_up", "expected"), [("once", 1), ("all", 1), ("skip", 0)])
def test_a_rule_changed_while_down_still_owes_the_downtime_one_run(
        any_spool: Spool, catch_up: str, expected: int) -> None:
    day = (int(time.time()) // DAY - 3) * DAY
    before = Scheduler([Schedule("nightly", cron="0 3 * * *", catch_up=catch_up)])
    assert _fired(before, any_spool, day + 3 * HOUR + 1) == [day + 3 * HOUR]
    after = Scheduler([Schedule("nightly", cron="0 4 * * *", catch_up=catch_up)])
    # Not each of the new rule's ticks since the old mark (it did not exist then): its
    # latest, once; "skip" starts with its next tick.
    assert _fired(after, any_spool, day + 2 * DAY + 10 * HOUR) == \
        [day + 2 * DAY + 4 * HOUR] * expected
    assert _fired(after, any_spool, day + 3 * DAY + 4 * HOUR + 1) == [day + 3 * DAY + 4 * HOUR]
    assert _fired(before, any_spool, day + 3 * DAY + 4 * HOUR + 2) == []  # nothing twice


def test_a_mark_fingerprinted_by_an_older_version_is_the_same_rule(any_spool: Spool) -> None:
    # Versions before 12-05 fingerprinted the cron text as written; an upgrade during a
    # downtime must not cost a catch-up schedule its missed runs.
    import hashlib

    from jobspool.queue.marks import RULE_MARK

    day = (int(time.time()) // DAY - 3) * DAY
    legacy = int.from_bytes(hashlib.sha256(b"cron 0 3 * * * UTC").digest()[:8], "big") >> 1
    with any_spool.hold_schedule_marks() as marks:
        marks["nightly"] = day + 3 * HOUR
        marks["nightly" + RULE_MARK] = legacy
    scheduler = Scheduler([Schedule("nightly", cron="0 3 * * *", catch_up="all")])
    assert _fired(scheduler, any_spool, day + 2 * DAY + 10 * HOUR) == \
        [day + DAY + 3 * HOUR, day + 2 * DAY + 3 * HOUR]


@pytest.mark.parametrize(("a", "b"), [("0 3 1 * *", "0 3 1 * 0-6"), ("0 3 * * 1-5", "0 3 1-31 * 1-5"),
                                      ("0 3 * * *", "0 3 * * 1-6"), ("0 3 * * *", "5 3 * * *")])
def test_rules_that_tick_differently_are_told_apart(a: str, b: str) -> None:
    # Day-of-month OR day-of-week when both are given: "1 * 0-6" is every day, not the 1st.
    assert Schedule("k", cron=a).rule_id != Schedule("k", cron=b).rule_id
    assert Schedule("k", cron=a).rule_id != Schedule("k", cron=a, tz="Europe/Paris").rule_id
