"""A process out of file descriptors (EMFILE) is told so, and loses nothing.

Found in a filesystem probe (`ulimit -n 14`, concurrency 8): a job file that could not be
opened for want of a descriptor was taken for unreadable, so the worker's own lease read
as lost ("lease lost, result discarded"), the job stayed leased and the logs blamed the
file. At `ulimit -n 10` the CLI printed a 108-line ExceptionGroup traceback, exit 1.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jobspool import JobState
from jobspool.errors import StoreUnavailable
from tests.spools import make_spool
from tests.subproc import REPO, cli_env


@contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """Every descriptor this process may open is taken (a low soft limit, then filled)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    held: list[int] = []
    try:
        with pytest.raises(OSError) as full:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        assert full.value.errno == 24  # EMFILE
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_out_of_descriptors_is_no_lost_lease_and_no_unreadable_file(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        waiting = spool.enqueue("k", {})
        leased = spool.enqueue("k", {})
        (lease,) = spool.claim(limit=1)
        assert lease.job_id == waiting.id
        with descriptors_exhausted():
            for call in (lambda: spool.heartbeat(lease), lambda: spool.complete(lease),
                         lambda: spool.get(leased.id), lambda: spool.claim(limit=1),
                         spool.stats):
                with pytest.raises(StoreUnavailable, match="ran out of file descriptors"):
                    call()
        # Nothing was quarantined nor taken for lost: the lease still settles.
        assert spool.complete(lease).state is JobState.COMPLETED
        assert spool.get(leased.id).state is JobState.READY
        assert not any((root / "quarantine").iterdir())


def test_the_cli_out_of_descriptors_says_so_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{} for _ in range(5)])
    (tmp_path / "fdapp.py").write_text("HANDLERS = {'k': lambda job, ctx: None}\n")
    env = cli_env(PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}")
    failed = []
    # Where the limit bites depends on what the interpreter has open: a few low ones, each
    # either enough to run or refused in one line (exit 2), and at least one refused.
    for limit in (9, 10, 11, 12):
        def low(limit: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE,
                               (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        done = subprocess.run(
            [sys.executable, "-m", "jobspool", "run-until-idle", "--root", str(root),
             "--app", "fdapp:HANDLERS"], env=env, cwd=tmp_path, preexec_fn=low,
            capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            continue
        first = done.stderr.splitlines()[0]
        assert done.returncode == 2, done.stderr
        assert first.startswith("jobspool: error: ") and "file descriptors" in first, first
        assert "ExceptionGroup" not in done.stderr
        failed.append(limit)
    assert failed, "no limit was low enough to refuse the run"
