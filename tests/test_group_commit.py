"""Group commit: concurrent producers share directory flushes, and an enqueue that returned
is on disk whatever happens to the other producers.

Four producer processes enqueue one job at a time, each printing the id after
`enqueue` returned; all are SIGKILLed at once mid-stream. Every printed id must
be a readable job file in `ready/` (checked two ways: the directory listing and
`Spool.get`), and the flushes really are shared: fewer directory flushes than
enqueues under contention (counted through the store's fsync seam in one
process with several threads).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState
from jobspool.queue import store as store_mod
from tests.spools import make_spool
from tests.subproc import REPO, cli_env

PRODUCER = textwrap.dedent("""
    import sys
    from jobspool import Spool
    s = Spool(sys.argv[1])
    me = sys.argv[2]
    i = 0
    while True:
        job = s.enqueue("k", {"p": me, "i": i}, job_id=f"{me}-{i}")
        print(job.id, flush=True)
        i += 1
""")


@pytest.mark.slow
def test_every_enqueue_that_returned_is_on_disk_after_the_producers_are_killed(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, str(root), f"p{n}"],
                              stdout=subprocess.PIPE, text=True, cwd=REPO, env=cli_env())
             for n in range(4)]
    acked: list[str] = []
    try:
        for p in procs:  # each has acknowledged at least 20 enqueues
            assert p.stdout is not None
            acked += [p.stdout.readline().strip() for _ in range(20)]
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
            assert p.stdout is not None
            acked += p.stdout.read().split()
            p.stdout.close()
    on_disk = {f[: -len(".json")] for f in os.listdir(root / "ready")}
    assert set(acked) <= on_disk
    with make_spool(root) as s:
        s.recover()
        assert all(s.get(job_id).state is JobState.READY for job_id in acked)
        assert s.fsck().ok


def test_concurrent_enqueues_share_directory_flushes(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    dir_flushes = 0
    real = store_mod.fsync_dir
    lock = threading.Lock()

    def counting(path: Any) -> None:
        nonlocal dir_flushes
        with lock:
            dir_flushes += 1
        time.sleep(0.002)  # a slow disk: the window in which others publish and wait
        real(path)

    with make_spool(tmp_path / "spool", durable=True, sync_mode="fsync") as s:
        monkeypatch.setattr(store_mod, "fsync_dir", counting)
        monkeypatch.setattr("jobspool.queue.journal.fsync_dir", counting)
        s.journal._group._flush_dir = counting  # noqa: SLF001 - the seam the group flush holds

        def produce(n: int) -> None:
            for i in range(25):
                s.enqueue("k", i, job_id=f"t{n}-{i}")

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(1 for _ in s.jobs(state="ready")) == 100
    assert dir_flushes < 100  # shared: one leader's flush covered several enqueues


def _counting_flushes(s: Any) -> list[str]:
    """Record (by directory name) every directory flush the group flush makes."""
    seen: list[str] = []
    real = s.journal._group._flush_dir  # noqa: SLF001 - the seam the group flush holds

    def counting(path: Any) -> None:
        seen.append(Path(path).name)
        real(path)

    s.journal._group._flush_dir = counting  # noqa: SLF001
    return seen


def test_a_failed_group_flush_leaves_the_directory_to_the_next_leader(tmp_path: Path) -> None:
    """A leader whose flush fails records nothing, so the next enqueue's flush covers the
    directory the failed one did not, besides its own."""
    from jobspool.errors import WriteFailed

    with make_spool(tmp_path / "spool", durable=True, sync_mode="fsync") as s:
        s.enqueue("k", 0)  # first flush after opening: every directory (new counters)
        seen = _counting_flushes(s)
        real = s.journal._group._flush_dir  # noqa: SLF001
        calls = {"n": 0}

        def failing_once(path: Any) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(5, "Input/output error")
            real(path)

        s.journal._group._flush_dir = failing_once  # noqa: SLF001
        with pytest.raises(WriteFailed):
            s.enqueue("k", 1, job_id="failed-flush")
        s.journal._group._flush_dir = real  # noqa: SLF001
        seen.clear()
        s.enqueue("k", 2, delay=3600)  # lands in retryable/; ready/ is still dirty
        assert sorted(seen) == ["ready", "retryable"]
        seen.clear()
        s.enqueue("k", 3, delay=3600)  # both flushed now: only its own directory
        assert seen == ["retryable"]


LEADER_KILLED_MID_FLUSH = textwrap.dedent("""
    import sys, time
    from jobspool import Spool
    s = Spool(sys.argv[1])
    s.enqueue("k", "warm")
    def stuck(path):
        print("flushing", flush=True)
        time.sleep(60)
    s.journal._group._flush_dir = stuck
    s.enqueue("k", "never acknowledged", job_id="in-flight")
""")


def test_a_leader_killed_mid_flush_makes_the_next_leader_flush_its_directory(
        tmp_path: Path) -> None:
    """A leader dies (SIGKILL) inside its flush, before recording it: the next leader
    flushes the directory the dead one had taken on (ready/, where its job was renamed),
    besides its own."""
    root = tmp_path / "spool"
    make_spool(root, durable=True, sync_mode="fsync").close()
    proc = subprocess.Popen([sys.executable, "-c", LEADER_KILLED_MID_FLUSH, str(root)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, env=cli_env())
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "flushing"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    with make_spool(root, durable=True, sync_mode="fsync") as s:
        seen = _counting_flushes(s)
        s.enqueue("k", "after", delay=3600)  # its own directory is retryable/ only
        assert sorted(seen) == ["ready", "retryable"]
        seen.clear()
        s.enqueue("k", "next", delay=3600)
        assert seen == ["retryable"]
        assert s.get("in-flight").state is JobState.READY  # renamed before the kill
