"""`.lock` emptied by hand (`: > .lock`, `truncate -s0`), an operator's neighbour of `rm
.lock`: every process that had the spool open touched its shared map past the file's end
at its next change and died of SIGBUS (exit 135, no message, leases left behind). Now the
next holder of the lock gives the file its size back and starts the shared state over.

Each scenario runs in child processes: on the old code the SIGBUS kills the process that
meets it, which must not be the test runner.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from jobspool import JobState, Spool

_PRELUDE = """
import os, sys, time
from jobspool import Spool
root = sys.argv[1]
"""


def _run(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_process_whose_lock_file_was_emptied_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "s"
    Spool(root).close()
    out = _run("""
        with Spool(root) as spool:
            spool.enqueue("k", 1, job_id="before")
            (first,) = spool.claim(limit=1, kinds="k")
            os.truncate(os.path.join(root, ".lock"), 0)
            spool.enqueue("k", 2, job_id="after")
            spool.heartbeat(first)
            spool.complete(first, "one")
            (second,) = spool.claim(limit=1, kinds="k")
            spool.complete(second, "two")
            print(first.token, second.token)
    """, str(root))
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    first, second = map(int, out.stdout.split())
    assert second > first  # tokens still strictly increasing across the refill
    assert (root / ".lock").stat().st_size > 0
    with Spool(root) as spool:
        assert {j.id: j.state for j in spool.jobs()} == {
            "before": JobState.COMPLETED, "after": JobState.COMPLETED}


def test_another_process_open_across_the_emptying_sees_every_change(tmp_path: Path) -> None:
    """A second process with the spool open (its claim cache built) before `.lock` was
    emptied: it neither dies nor misses the job enqueued after (its cached listing must
    not pass for current because a generation number came round again)."""
    root = tmp_path / "s"
    with Spool(root) as spool:
        for i in range(3):
            spool.enqueue("k", i, job_id=f"old{i}")
    worker = subprocess.Popen(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent("""
            with Spool(root) as spool:
                got = [lease.job_id for lease in spool.claim(limit=1, kinds="k")]
                print("ready", flush=True)
                sys.stdin.readline()  # the parent empties .lock and enqueues meanwhile
                while True:
                    leases = spool.claim(limit=10, kinds="k")
                    if not leases:
                        break
                    got += [lease.job_id for lease in leases]
                    spool.complete_many([(lease, None) for lease in leases])
                print(" ".join(sorted(got)))
        """), str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert worker.stdout is not None and worker.stdin is not None
    assert worker.stdout.readline().strip() == "ready"
    (root / ".lock").write_bytes(b"")
    producer = _run("""
        with Spool(root) as spool:
            spool.enqueue("k", 9, job_id="new")
    """, str(root))
    assert producer.returncode == 0, producer.stderr[-2000:]
    worker.stdin.write("go\n")
    worker.stdin.flush()
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, (worker.returncode, err[-2000:])
    assert out.split() == ["new", "old0", "old1", "old2"]


def test_emptying_the_lock_file_under_a_pool_and_producers_kills_nothing(
        tmp_path: Path) -> None:
    """Checked once per hold, a truncation that landed inside another process's hold still
    killed it at its next touch of the map (half the time under a busy pool, and producers
    in their group flush, outside any hold): the shared data is now read and written by
    position, so a read past the end is zeros. Real processes: a pool of two, two
    producers, `.lock` emptied every 0.1 s while they run."""
    import os
    import signal
    import time

    import orjson

    from tests.cli_harness import environment, reap, start_jobspool

    root = tmp_path / "s"
    log = tmp_path / "runs"
    Spool(root).close()
    env = {"JOBSPOOL_TEST_LOG": str(log)}
    pool = start_jobspool("worker", "--processes", "2", "--concurrency", "2", "--app",
                          "tests.apps.ledger:app", "--json", "--no-maintenance", root=root,
                          env=env)
    producers = [subprocess.Popen(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent("""
            with Spool(root) as spool:
                for i in range(150):
                    spool.enqueue("record", i, job_id=f"{sys.argv[2]}{i}")
                    time.sleep(0.003)
        """), str(root), name], env=environment(env), stderr=subprocess.PIPE)
        for name in ("a", "b")]
    emptied = 0
    try:
        while any(p.poll() is None for p in producers):
            time.sleep(0.1)
            os.truncate(root / ".lock", 0)
            emptied += 1
        said = [p.communicate(timeout=120)[1] for p in producers]  # closes their pipes
        codes = [p.returncode for p in producers]
        with Spool(root) as spool:
            deadline = time.monotonic() + 120
            while sum(1 for j in spool.jobs() if j.state is JobState.COMPLETED) < 300:
                assert pool.poll() is None and time.monotonic() < deadline, pool.poll()
                time.sleep(0.1)
        pool.send_signal(signal.SIGTERM)
        out, err = pool.communicate(timeout=120)
    finally:
        for p in producers:
            reap(p)
        reap(pool)
    assert emptied >= 3
    assert codes == [0, 0], said
    assert pool.returncode == 0, err.decode()[-3000:]
    report = orjson.loads(out)
    assert report["restarts"] == 0 and report["completed"] == 300, report
    runs = [line.split()[1] for line in log.read_text().splitlines() if line.startswith("run ")]
    assert sorted(runs) == sorted(f"{p}{i}" for p in "ab" for i in range(150))  # once each
