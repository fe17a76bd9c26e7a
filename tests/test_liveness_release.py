"""A process that opens and closes spools on many roots does not keep a descriptor (its
liveness lock) for each until it exits: the last spool closed on a root takes the mark
with it. A long-lived service of many tenants ran out of descriptors (so did the test
session itself: select() refused descriptors past 1023)."""

from __future__ import annotations

import os
from pathlib import Path

from jobspool import JobState, Spool


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_closing_the_last_spool_on_a_root_releases_its_liveness_lock(tmp_path: Path) -> None:
    for i in range(3):  # warm: imports and caches that open files once
        with Spool(tmp_path / f"warm{i}", durable=False) as s:
            s.enqueue("k")
    before = _open_fds()
    for i in range(40):
        with Spool(tmp_path / f"s{i}", durable=False) as s:
            s.enqueue("k")
            assert len(os.listdir(tmp_path / f"s{i}" / "live")) == 1
        assert os.listdir(tmp_path / f"s{i}" / "live") == []
    assert _open_fds() - before < 5


def test_the_mark_stays_while_another_spool_on_the_root_is_open(tmp_path: Path) -> None:
    root = tmp_path / "s"
    first = Spool(root, durable=False)
    second = Spool(root, durable=False)
    first.enqueue("k", job_id="a")
    ident = first.leasing.process_mark().ident
    first.close()
    assert os.listdir(root / "live") == [f"{ident}.lock"]  # the second spool still has it
    second.enqueue("k", job_id="b")  # still writes under the same, live mark
    assert os.listdir(root / "live") == [f"{ident}.lock"]
    second.close()
    assert os.listdir(root / "live") == []
    with Spool(root, durable=False) as again:  # and a new spool makes a new one
        again.enqueue("k", job_id="c")
        assert {j.id for j in again.jobs()} == {"a", "b", "c"}


def test_a_closed_spool_whose_leases_are_held_leaves_them_to_be_reclaimed_at_once(
        tmp_path: Path) -> None:
    """As at exit: the file stays, unlocked, so another process's recover sees the holder
    gone instead of waiting out the lease."""
    import subprocess
    import sys

    root = tmp_path / "s"
    with Spool(root, durable=False, lease_seconds=3600) as s:
        s.enqueue("k", job_id="j")
    holder = Spool(root, durable=False, lease_seconds=3600)
    assert len(holder.claim()) == 1
    holder.close()
    assert os.listdir(root / "live")  # kept: a lease names this process
    code = ("import sys; from jobspool import Spool\n"
            "with Spool(sys.argv[1]) as s:\n"
            "    r = s.recover(); print(r.leases_returned + r.leases_reclaimed)")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "'j'" in out, out
    with Spool(root, durable=False) as s:
        assert s.get("j").state is not JobState.LEASED  # an hour before its lease expires


def test_a_forked_child_closing_its_parents_spool_keeps_its_own_mark(tmp_path: Path) -> None:
    """The count is per process: a child closing the spool it inherited must not drop the
    mark its own open spool on the root still needs (its leases would look dead)."""
    root = tmp_path / "s"
    inherited = Spool(root, durable=False)
    inherited.enqueue("k", job_id="parent")
    pid = os.fork()
    if pid == 0:  # the child: exit status says whether its mark survived
        code = 1
        try:
            own = Spool(root, durable=False)
            own.enqueue("k", job_id="child")
            ident = own.leasing.process_mark().ident
            inherited.close()
            code = 0 if (root / "live" / f"{ident}.lock").exists() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    inherited.close()
