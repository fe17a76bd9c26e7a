"""Schedules on a PostgreSQL store shared by several machines (DESIGN §9: any number of workers
may run the same schedules; each tick enqueues exactly one job). Two `Spool` objects with their
own `local_dir` stand for two machines: they share the database and nothing else."""

from __future__ import annotations

import time
from pathlib import Path

from jobspool import Schedule
from jobspool.schedules import Scheduler
from tests.spools import make_spool


def _machines(tmp_path: Path) -> tuple[Path, Path]:
    dirs = (tmp_path / "machine-a", tmp_path / "machine-b")
    for d in dirs:
        d.mkdir()
    return dirs


def test_a_tick_fired_on_one_machine_is_not_fired_again_on_another_after_pruning(
        pg_url: str, tmp_path: Path) -> None:
    schedules = [Schedule("tick", every=60)]
    now = time.time()
    dir_a, dir_b = _machines(tmp_path)
    with make_spool(pg_url, local_dir=dir_a) as a, make_spool(pg_url, local_dir=dir_b) as b:
        (fired,) = Scheduler(schedules).tick(a, now)
        assert len(fired.created) == 1
        (lease,) = a.claim()
        a.complete(lease)
        assert a.prune(keep=0).pruned == fired.created  # retention did its job
        again = Scheduler(schedules).tick(b, now)  # the same moment, seen from machine b
        assert [f.created for f in again if f.created] == []
        assert list(b.jobs()) == []


def test_catch_up_on_a_machine_that_was_down_does_not_rerun_ticks_another_machine_ran(
        pg_url: str, tmp_path: Path) -> None:
    schedules = [Schedule("tick", every=60, catch_up="all")]
    t0 = time.time() - 600
    dir_a, dir_b = _machines(tmp_path)
    with make_spool(pg_url, local_dir=dir_a) as a, make_spool(pg_url, local_dir=dir_b) as b:
        Scheduler(schedules).tick(b, t0)  # b saw the schedule once, then went down
        ran = set()
        for k in range(1, 11):  # a fires the next ten minutes' ticks and runs them
            for f in Scheduler(schedules).tick(a, t0 + 60 * k):
                ran.update(f.created)
            for lease in a.claim(limit=10):
                a.complete(lease)
        a.prune(keep=0)
        rerun = [i for f in Scheduler(schedules).tick(b, t0 + 600) for i in f.created]
        assert set(rerun) & ran == set(), f"ticks run twice: {sorted(set(rerun) & ran)}"
