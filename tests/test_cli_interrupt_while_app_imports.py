"""SIGINT while `--app` is still importing stops the command, also when it was started
with SIGINT ignored (a script's background job: `jobspool worker ... &`).

Found by a probe: started that way, a `kill -INT` during the import was lost, the worker
served on (for ten minutes, until another SIGINT) and `run-until-idle` ran the jobs and
exited 0; the same signal a moment later, once the run began, stopped it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from jobspool import JobState
from tests.cli_harness import reap, start_jobspool
from tests.spools import make_spool


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a non-interactive shell's `&` does


@pytest.mark.parametrize("command", ["run-until-idle", "worker"])
@pytest.mark.parametrize("background", [True, False])
def test_sigint_during_the_app_import_stops_the_command_and_runs_nothing(
        tmp_path: Path, command: str, background: bool) -> None:
    root = tmp_path / "spool"
    marker = tmp_path / "importing"
    with make_spool(root) as spool:
        spool.enqueue("noop", {}, job_id="not-yet")
    proc = start_jobspool(command, "--app", "tests.apps.slowimport:app", root=root,
                          env={"SLOWIMPORT_MARKER": str(marker)},
                          preexec_fn=_ignore_sigint if background else None)
    try:
        deadline = time.monotonic() + 60  # a hang guard only
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert marker.exists(), proc.communicate(timeout=60)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        reap(proc)
    assert proc.returncode == 130, err.decode()
    assert "interrupted by SIGINT" in err.decode()
    with make_spool(root) as spool:
        assert spool.get("not-yet").state is JobState.READY
