"""A drain gives up on a store outage that outlasts `--wait-for-store`.

`run-until-idle` on a spool whose disk was full waited for it for ever, logging once a
minute: a script that runs it (a cron job, a deploy step) hung with it. A worker service
still waits an outage out however long it lasts; a drain waits `--wait-for-store`
seconds (30 by default; `run_until_idle(wait_for_store=...)` in Python), then stops,
exit 2, one line naming the outage, nothing lost.
"""

from __future__ import annotations

import errno
import textwrap
from pathlib import Path

import pytest

from jobspool import Spool, Worker
from jobspool.errors import WorkerCrashed
from jobspool.queue.states import JobState
from jobspool.queue.supervisor import StoreOutage, Supervisor
from tests.test_full_disk_lock import _on_a_small_tmpfs

FULL_DISK = textwrap.dedent('''
    set -u
    mount -t tmpfs -o size=2m tmpfs "$DIR"
    py() {{ PYTHONPATH={repo} {python} "$@"; }}
    py -m jobspool --root "$DIR/s" init >/dev/null
    py -c "
    import sys; from jobspool import Spool
    s = Spool(sys.argv[1])
    s.enqueue_many('work', [{{'i': i}} for i in range(20)])
    " "$DIR/s"
    dd if=/dev/zero of="$DIR/filler" bs=4k 2>/dev/null
    timeout 120 env PYTHONPATH={repo} {python} -m jobspool --root "$DIR/s" run-until-idle \\
        --app tests.apps.simple:app --wait-for-store 1 >/dev/null 2>"$DIR/../err"
    echo "rc $?" > "$DIR/../first"
    rm "$DIR/filler"
    py -m jobspool --root "$DIR/s" run-until-idle --app tests.apps.simple:app \\
        --json > "$DIR/../second"
    echo "rc $?" >> "$DIR/../first"
    ls "$DIR/s/completed" | wc -l > "$DIR/../completed"
''')


def test_a_drain_on_a_full_disk_stops_after_wait_for_store_and_loses_nothing(
        tmp_path: Path) -> None:
    _on_a_small_tmpfs(FULL_DISK, tmp_path)
    lines = [line.split() for line in (tmp_path / "first").read_text().splitlines()]
    rcs = [value for key, value in lines if key == "rc"]
    err = (tmp_path / "err").read_text()
    # 124 is `timeout`'s: the drain that waited for ever.
    assert rcs[0] == "2", err
    last = [line for line in err.splitlines() if line.startswith("jobspool: error:")]
    assert len(last) == 1 and "unavailable" in last[0] and "--wait-for-store 1" in last[0], err
    assert "Traceback" not in err
    assert rcs[1] == "0"
    assert int((tmp_path / "completed").read_text()) == 20


def test_run_until_idle_wait_for_store_is_checked(tmp_path: Path) -> None:
    with Spool(tmp_path / "s") as spool:
        worker = Worker(spool, handlers={"work": lambda job, ctx: None})
        for bad in (-1, float("nan"), "5"):
            with pytest.raises(ValueError, match="wait_for_store"):
                worker.run_until_idle(wait_for_store=bad)  # type: ignore[arg-type]
        spool.enqueue("work", {})
        # inf: no limit, as None.
        assert worker.run_until_idle(wait_for_store=float("inf")).completed == 1


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_supervisor_gives_up_on_an_outage_only_past_the_patience() -> None:
    from jobspool.errors import StoreUnavailable
    from jobspool.queue.report import Counters

    clock = _Clock()
    sup = Supervisor(clock=clock)
    counters = Counters()
    down = StoreUnavailable("database went away")
    assert sup.record(down, counters, patience=10) is None
    clock.now += 9.5
    assert sup.record(down, counters, patience=10) is None
    clock.now += 1.0
    verdict = sup.record(down, counters, patience=10)
    assert isinstance(verdict, StoreOutage) and isinstance(verdict, WorkerCrashed)
    assert "unavailable for 10 s" in str(verdict) and "database went away" in str(verdict)
    # Without a patience (a worker service), the same outage is waited out.
    assert sup.record(down, counters) is None
    # An answer ends the outage: the next one is timed from its own start.
    sup.reached()
    clock.now += 100
    assert sup.record(down, counters, patience=10) is None
    assert counters.crashes == 0  # an outage is no failure of ours


def test_a_python_drain_raises_the_outage_and_leaves_the_jobs(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """`run_until_idle(wait_for_store=...)` from Python: the verdict is raised, the jobs
    stay where they were, and a later drain runs them."""
    from jobspool.errors import WriteFailed

    spool = Spool(tmp_path / "s")
    spool.enqueue_many("work", [{"i": i} for i in range(3)])
    real_claim = type(spool).claim

    def full(*args: object, **kwargs: object) -> object:
        raise WriteFailed("No space left on device", errno=errno.ENOSPC)

    monkeypatch.setattr(type(spool), "claim", full)
    worker = Worker(spool, handlers={"work": lambda job, ctx: None})
    with pytest.raises(StoreOutage, match="unavailable"):
        worker.run_until_idle(wait_for_store=0.3)
    monkeypatch.setattr(type(spool), "claim", real_claim)
    assert {j.state for j in spool.jobs()} == {JobState.READY}
    assert worker.run_until_idle().completed == 3
    spool.close()
