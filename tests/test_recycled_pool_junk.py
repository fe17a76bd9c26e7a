"""What an operator (or anything else) leaves in `tmp/pool/`, the store's recycled files,
never stops the queue, never takes a job's bytes and never writes outside the spool.

Found by a probe: a FIFO in the pool hung a worker in open() for good (past SIGTERM); a
directory there made every later write fail and `recover` with it, again on every run; a
symlink was followed, so a job's bytes were written into the file it named.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobspool import JobState
from tests.spools import make_spool

# The steps run in a process of their own: on the code before the fix, a FIFO hung it in
# open() for good, which only a process boundary (and its timeout) gets a test out of.
_SCENARIO = textwrap.dedent("""
    import sys
    from jobspool import Spool, Worker
    with Spool(sys.argv[1], durable=False) as spool:
        for i in range(30):
            spool.enqueue("note", {"n": i}, job_id=f"after-{i}")
        report = Worker(spool, {"note": lambda job, ctx: job.payload["n"] * 2}
                        ).run_until_idle()
        print(report.completed)
        spool.recover()
""")


def _fill_pool(root: Path) -> list[Path]:
    """A spool whose pool holds recycled files (a job life retires its old copies there)."""
    with make_spool(root) as spool:
        for i in range(12):
            spool.enqueue("note", {"n": i}, job_id=f"before-{i}")
        for lease in spool.claim(limit=12, owner="filler"):
            spool.complete(lease, result=None)
    pool = sorted((root / "tmp" / "pool").iterdir())
    assert pool, "the store recycled no file into tmp/pool/"
    return pool


def _junk(kind: str, path: Path, outside: Path) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_text("an operator's note")
    elif kind == "symlink":
        path.symlink_to(outside)
    elif kind == "hard link":
        os.link(outside, path)
    elif kind == "device":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers


_KINDS = ["fifo", "directory", "symlink", "hard link"] + (
    ["device"] if os.geteuid() == 0 else [])  # making a device node takes root


@pytest.mark.parametrize("kind", _KINDS)
def test_junk_in_the_recycled_pool_is_dropped_and_every_job_runs(tmp_path: Path,
                                                                 kind: str) -> None:
    root = tmp_path / "spool"
    outside = tmp_path / "outside.txt"
    outside.write_text("not the spool's")
    for path in _fill_pool(root):
        _junk(kind, path, outside)

    done = subprocess.run([sys.executable, "-c", _SCENARIO, str(root)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["30"]
    assert outside.read_text() == "not the spool's"  # nothing written through a link
    with make_spool(root) as spool:
        jobs = [spool.get(f"after-{i}") for i in range(30)]
        assert [j.state for j in jobs] == [JobState.COMPLETED] * 30
        assert [j.result for j in jobs] == [i * 2 for i in range(30)]
        assert spool.fsck().ok
    # Whatever is left in the pool is a plain file of the spool's own.
    for entry in (root / "tmp" / "pool").iterdir():
        st = entry.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1, entry
