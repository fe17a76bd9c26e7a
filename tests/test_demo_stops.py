"""`jobspool demo` stops what it started, and refuses sizes it cannot serve (a CLI probe).

The demo runs its workers as child processes. Stopped by SIGTERM (a service stop, `kill`),
it left them draining the spool under init; a run longer than a fixed 300 s ended in a
traceback, the workers running on.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli_harness import one_error_line, reap, run_jobspool, start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

JOBS = 60000  # a drain of minutes for two workers: stopped, they must not finish it


def _workers_of(root: Path) -> list[int]:
    """Pids of the demo's worker processes serving `root` (their command lines name it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if b"run-until-idle" in cmdline and str(root).encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_demo_stopped_by_sigterm_stops_its_workers_and_leaves_no_lease(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    # Its own session: the signal reaches the demo alone, as `kill PID` or a service
    # manager stopping one process does (Ctrl-C in a terminal reaches the whole group).
    demo = start_jobspool("--root", root, "demo", "--jobs", str(JOBS), "--workers", "2",
                          start_new_session=True)
    try:
        wait_until(lambda: len(_workers_of(root)) == 2, 120, "the demo's two workers", proc=demo)
        demo.send_signal(signal.SIGTERM)
        demo.communicate(timeout=60)
    finally:
        reap(demo)
    assert demo.returncode != 0
    # Stopped with SIGTERM, a worker gives its leases back and exits (in well under a
    # second here; the bound only guards against a hang), long before the spool is drained.
    wait_until(lambda: not _workers_of(root), 20, "the demo's workers to exit")
    with make_spool(root, create=False) as spool:
        stats = spool.stats()
        assert stats.counts["leased"] == 0
        assert stats.total == JOBS  # nothing lost either way
        assert stats.counts["ready"] + stats.counts["retryable"] > 0  # stopped, not drained
    assert run_jobspool("--root", root, "fsck").returncode == 0


def test_demo_of_one_job_completes_it(tmp_path: Path) -> None:
    # The broken document sat at index jobs // 2: with one job, the demo only failed.
    root = tmp_path / "spool"
    done = run_jobspool("--root", root, "demo", "--jobs", "1")
    assert done.returncode == 0, done.stderr
    with make_spool(root, create=False) as spool:
        assert spool.stats().counts["completed"] == 1


def test_demo_refuses_more_workers_than_it_can_serve_and_starts_none(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    r = run_jobspool("--root", root, "demo", "--workers", "65")
    assert r.returncode == 1
    assert "at most 64" in one_error_line(r)
    assert not root.exists()


@pytest.mark.parametrize("value", ["0.001", "0.0099"])
def test_init_refuses_a_lease_no_worker_could_serve(tmp_path: Path, value: str) -> None:
    # Settings are fixed at creation: a spool made with a 1 ms lease was refused by every
    # worker run without its own --lease-seconds.
    root = tmp_path / "spool"
    r = run_jobspool("--root", root, "init", "--lease-seconds", value)
    assert r.returncode == 1
    assert "too short for a worker" in one_error_line(r)
    assert not root.exists()
    ok = run_jobspool("--root", root, "init", "--lease-seconds", "0.01")
    assert ok.returncode == 0, ok.stderr


def test_demo_waits_for_its_workers_without_a_time_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    # A demo of 300,000 jobs on one worker ran past a fixed 300 s and died in a traceback.
    # Checked at the seam rather than by a five-minute run: the wait has no time limit.
    from jobspool import demo

    waits: list[float | None] = []

    class Recording(subprocess.Popen):  # type: ignore[type-arg]
        def communicate(self, input: object = None, timeout: float | None = None) -> object:
            waits.append(timeout)
            return super().communicate(input, timeout)

    monkeypatch.setattr(demo.subprocess, "Popen", Recording)
    assert demo.run_demo(root=str(tmp_path / "spool"), jobs=5, workers=1, as_json=True) == 0
    assert waits == [None]
    assert '"completed": 4' in capsys.readouterr().out
