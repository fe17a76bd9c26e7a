"""Health sees stuck work: unreadable files, ready files nobody claims, a nearly full disk,
a worker that stopped refreshing its metrics. Each is `degraded` with its reason, and
`ok` again once fixed."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from jobspool import JobState, Spool
from jobspool import health as health_mod
from jobspool.health import host as health_host
from jobspool.cli import main
from jobspool.health import check_health
from tests.conftest import FakeClock
from tests.spools import make_spool
from tests.waiting import wait_until

GUARD_SECONDS = 30.0


@pytest.fixture
def spool(spool_root: Path, clock: FakeClock) -> Iterator[Spool]:
    s = make_spool(spool_root, clock=clock, lease_seconds=30.0)
    yield s
    s.close()


def _hand_made_job(tmp_path: Path, job_id: str, clock: FakeClock) -> Path:
    with make_spool(tmp_path / "backup", clock=clock) as other:
        other.enqueue("mail", {"to": "x"}, job_id=job_id)
    return tmp_path / "backup" / "ready" / f"{job_id}.json"


def test_an_unreadable_file_in_a_state_directory_degrades_until_it_is_removed(
        spool: Spool) -> None:
    spool.enqueue("mail")
    bad = spool.root / "ready" / "garbled.json"
    bad.write_bytes(b'{"id": "garbled", "state": ')
    with pytest.warns(Warning):  # stats skips the file with a warning
        health = check_health(spool)
    assert health.codes() == ["unreadable_files"]
    (reason,) = health.reasons
    assert reason.value == 1 and "ready/garbled.json" in reason.message
    assert "jobspool recover" in reason.message
    bad.unlink()
    assert check_health(spool).ok


def test_an_unreadable_file_is_fixed_by_recover_then_a_quarantine_purge(spool: Spool) -> None:
    (spool.root / "retryable" / "empty.json").write_bytes(b"")
    with pytest.warns(Warning):  # stats skips the file with a warning
        assert "unreadable_files" in check_health(spool).codes()
    spool.recover()
    assert check_health(spool).codes() == ["quarantined_files"]
    assert main(["--root", str(spool.root), "quarantine", "purge"]) == 0
    assert check_health(spool).ok


def test_a_file_placed_in_ready_by_hand_degrades_until_a_running_worker_claims_it(
        spool: Spool, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert spool.claim() == []  # a worker whose claim index is current and empty
    shutil.copyfile(_hand_made_job(tmp_path, "restored", clock),
                    spool.root / "ready" / "restored.json")
    assert check_health(spool, max_due_age=60.0).ok  # it has just arrived
    arrived = time.time()
    monkeypatch.setattr(health_mod, "wall_clock", lambda: arrived + 61.0)
    health = check_health(spool, max_due_age=60.0)
    assert health.codes() == ["ready_not_claimed"]
    assert "restored" in health.reasons[0].message
    # The running spool notices the file behind its back.
    wait_until(spool.claim, GUARD_SECONDS, "the hand-placed job to be claimed")
    assert spool.get("restored").state is JobState.LEASED
    assert check_health(spool, max_due_age=60.0).ok


def _statvfs(free_blocks: int, blocks: int = 1_000_000, frsize: int = 4096, *,
             free_inodes: int = 500_000, inodes: int = 1_000_000,
             flag: int = 0) -> SimpleNamespace:
    return SimpleNamespace(f_bavail=free_blocks, f_blocks=blocks, f_frsize=frsize,
                           f_favail=free_inodes, f_files=inodes, f_flag=flag)


def test_free_disk_below_either_bound_degrades_and_clears_when_space_returns(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = {"free": 10}  # 40 KiB of 4 GB free
    monkeypatch.setattr(health_host, "os_statvfs", lambda path: _statvfs(disk["free"]))
    health = check_health(spool)
    assert health.codes() == ["low_disk_space"]
    assert health.reasons[0].value == 10 * 4096
    assert health.to_dict()["figures"]["free_bytes"] == 10 * 4096
    disk["free"] = 500_000  # 2 GB, 50 %
    assert check_health(spool).ok
    assert check_health(spool, min_free_percent=60.0).codes() == ["low_disk_space"]
    assert check_health(spool, min_free_bytes=3 * 2**30).codes() == ["low_disk_space"]
    assert check_health(spool, min_free_bytes=0, min_free_percent=0.0).ok


def _metrics_file(root: Path, owner: str, written_at: float) -> Path:
    path = root / "metrics" / f"{owner}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(orjson.dumps({"format": 1, "owner": owner, "pid": 1,
                                   "written_at": written_at, "claimed": 3}))
    return path


def test_a_worker_whose_metrics_file_went_stale_degrades_until_it_refreshes_or_is_removed(
        spool: Spool) -> None:
    now = time.time()
    _metrics_file(spool.root, "host-a:100", now)
    stale = _metrics_file(spool.root, "host-b:200", now - 120.0)
    health = check_health(spool, worker_stale=60.0)
    assert health.codes() == ["worker_stale"]
    assert "host-b:200" in health.reasons[0].message and "host-a:100" not in \
        health.reasons[0].message
    _metrics_file(spool.root, "host-b:200", time.time())  # the worker came back to life
    assert check_health(spool, worker_stale=60.0).ok
    os.utime(stale, (now - 120.0, now - 120.0))
    stale.write_bytes(b"not json")  # unreadable: judged by its modification time
    os.utime(stale, (now - 120.0, now - 120.0))
    assert check_health(spool, worker_stale=60.0).codes() == ["worker_stale"]
    stale.unlink()  # the operator removed what a dead worker left
    assert check_health(spool, worker_stale=60.0).ok


def test_the_health_command_takes_the_new_bounds_and_exits_2_with_their_reason(
        spool: Spool, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(spool.root)
    assert main(["--root", root, "health", "--json"]) == 0
    capsys.readouterr()
    assert main(["--root", root, "health", "--json", "--min-free-bytes",
                 str(2**62)]) == 2
    doc = orjson.loads(capsys.readouterr().out)
    assert [r["code"] for r in doc["reasons"]] == ["low_disk_space"]
    _metrics_file(spool.root, "w", time.time() - 10.0)
    assert main(["--root", root, "health", "--worker-stale", "5"]) == 2
    assert "[worker_stale]" in capsys.readouterr().out
    assert main(["--root", root, "health", "--min-free-percent", "101"]) == 1
    assert "101" in capsys.readouterr().err


def _written_at(root: Path) -> list[float]:
    files = sorted((root / "metrics").glob("*.json")) if (root / "metrics").is_dir() else []
    return [float(orjson.loads(p.read_bytes())["written_at"]) for p in files]


def test_an_idle_worker_keeps_its_metrics_file_fresh_and_a_finished_run_leaves_none(
        tmp_path: Path) -> None:
    import threading

    from jobspool import Worker

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("echo", {"n": 1})
        Worker(spool, {"echo": lambda job, ctx: job.payload}, maintenance=False) \
            .run_until_idle()
        assert _written_at(root) == []  # a finished run is not a stale worker
        worker = Worker(spool, {"echo": lambda job, ctx: job.payload}, maintenance=False)
        thread = threading.Thread(target=worker.run_forever, kwargs={"handle_signals": False})
        thread.start()
        try:
            # Readiness: the worker published once.
            (first,) = wait_until(lambda: _written_at(root), GUARD_SECONDS,
                                  "the worker to publish its metrics")
            # Idle, no job: it still refreshes the file.
            wait_until(lambda: _written_at(root) != [first], GUARD_SECONDS,
                       "an idle worker to refresh its metrics")
            assert check_health(spool, worker_stale=60.0).ok
        finally:
            worker.stop()
            thread.join(GUARD_SECONDS)
        assert not thread.is_alive()
        assert _written_at(root) == []  # a clean exit removes the file


def test_a_disk_short_of_space_and_inodes_names_both(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found in an operations probe: with both short, the reason named the inodes alone.
    monkeypatch.setattr(health_host, "os_statvfs",
                        lambda path: _statvfs(10, free_inodes=2, inodes=300))
    (reason,) = check_health(spool).reasons
    assert "MiB free" in reason.message and "inodes free" in reason.message
    assert reason.value == 10 * 4096


def test_a_filesystem_out_of_inodes_or_read_only_degrades(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Gigabytes free but no inodes: every enqueue failed while health said ok.
    monkeypatch.setattr(health_host, "os_statvfs",
                        lambda path: _statvfs(900_000, free_inodes=2, inodes=300))
    health = check_health(spool)
    assert health.codes() == ["low_disk_space"] and "inodes" in health.reasons[0].message
    # A read-only mount: the reason names it, not a mode to chmod.
    monkeypatch.setattr(health_host, "os_statvfs",
                        lambda path: _statvfs(900_000, flag=os.ST_RDONLY))
    health = check_health(spool)
    assert health.codes() == ["state_dir_not_writable"]
    assert "read-only" in health.reasons[0].message
