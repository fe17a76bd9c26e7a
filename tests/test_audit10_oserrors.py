"""Issue 10 item 7, audited: `jobspool init` on a failing disk says where and what to do.

Found in the audit: the two files a new spool starts with (`spool.json`, then
`fence`) were written outside the path that turns an OSError into a
`WriteFailed`, so an I/O error creating a spool printed `jobspool: error:
Input/output error` — no path, no hint — and a full disk named only a
staging file. Faults come from the kernel's side (`strace -e inject`), the
way `test_strace_faults.py` makes them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobspool import Spool
from tests.subproc import REPO, cli_env


def _init(root: Path, *strace: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*strace, sys.executable, "-m", "jobspool", "--root", str(root),
                           "init"], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize(("syscall", "err", "hint"), [
    ("fsync", "EIO", "I/O error"),
    ("fsync", "ENOSPC", "disk is full"),
    ("rename", "ENOSPC", "disk is full"),
])
def test_init_on_a_failing_disk_is_one_line_naming_the_spool_and_what_to_do(
        tmp_path: Path, syscall: str, err: str, hint: str) -> None:
    assert shutil.which("strace"), "strace is required (.ci/run installs it)"
    root = tmp_path / "spool"
    names = "rename,renameat,renameat2" if syscall == "rename" else syscall
    proc = _init(root, "strace", "-f", "-qq", "-o", "/dev/null", "-e",
                 f"inject={names}:error={err}:when=1")
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobspool: error: "), proc.stderr
    assert str(root) in lines[0] and hint in lines[0], lines[0]
    again = _init(root)  # what the operator does once the disk is fixed
    assert again.returncode == 0, again.stderr
    with Spool(root) as spool:
        assert spool.enqueue("work", {}, job_id="j1").state == "ready"


def test_an_io_error_reading_the_fence_names_the_file(tmp_path: Path) -> None:
    # Found in the audit: `recover` printed `jobspool: error: Input/output error` (the store
    # reads through a descriptor, so the OSError carried no file name).
    root = tmp_path / "spool"
    with Spool(root) as spool:
        spool.enqueue("work", {}, job_id="j1")
    template = tmp_path / "template"
    shutil.copytree(root, template, symlinks=True)
    trace = tmp_path / "read.trace"
    # Which read(2) of the main thread reads `fence`: learned from an unfaulted run.
    calibrate = subprocess.run(
        ["strace", "-qq", "-y", "-o", str(trace), "-e", "trace=read", sys.executable, "-m",
         "jobspool", "--root", str(root), "recover"], cwd=REPO, env=cli_env(),
        capture_output=True, text=True, timeout=120)
    assert calibrate.returncode == 0, calibrate.stderr
    reads = [line for line in trace.read_text().splitlines() if line.startswith("read(")]
    n = next(i for i, line in enumerate(reads, 1) if f"{root}/fence>" in line)
    shutil.rmtree(root)
    shutil.copytree(template, root, symlinks=True)
    proc = subprocess.run(
        ["strace", "-qq", "-o", "/dev/null", "-e", f"inject=read:error=EIO:when={n}",
         sys.executable, "-m", "jobspool", "--root", str(root), "recover"], cwd=REPO,
        env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobspool: error: "), proc.stderr
    assert str(root / "fence") in lines[0], lines[0]
