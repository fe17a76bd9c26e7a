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
from pathlib import Path

import pytest

from tests.cli_harness import one_error_line, run_jobspool
from tests.spools import make_spool


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
    proc = run_jobspool("init", root=root, prefix=("strace", "-f", "-qq", "-o", "/dev/null", "-e",
                                                   f"inject={names}:error={err}:when=1"))
    line = one_error_line(proc, 2)
    assert str(root) in line and hint in line, line
    again = run_jobspool("init", root=root)  # what the operator does once the disk is fixed
    assert again.returncode == 0, again.stderr
    with make_spool(root) as spool:
        assert spool.enqueue("work", {}, job_id="j1").state == "ready"


def test_an_io_error_reading_the_fence_names_the_file(tmp_path: Path) -> None:
    # Found in the audit: `recover` printed `jobspool: error: Input/output error` (the store
    # reads through a descriptor, so the OSError carried no file name).
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="j1")
    template = tmp_path / "template"
    shutil.copytree(root, template, symlinks=True)
    trace = tmp_path / "read.trace"
    # Which read(2) of the main thread reads `fence`: learned from an unfaulted run.
    calibrate = run_jobspool("recover", root=root,
                             prefix=("strace", "-qq", "-y", "-o", str(trace), "-e", "trace=read"))
    assert calibrate.returncode == 0, calibrate.stderr
    reads = [line for line in trace.read_text().splitlines() if line.startswith("read(")]
    n = next(i for i, line in enumerate(reads, 1) if f"{root}/fence>" in line)
    shutil.rmtree(root)
    shutil.copytree(template, root, symlinks=True)
    proc = run_jobspool("recover", root=root, prefix=("strace", "-qq", "-o", "/dev/null", "-e",
                                                      f"inject=read:error=EIO:when={n}"))
    line = one_error_line(proc, 2)
    assert str(root / "fence") in line, line
