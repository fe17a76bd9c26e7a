"""Issue 10 item 5, audited: a worker that dies is charged only for handlers still running.

A batch mate whose handler had already *returned* when another job killed the
process was not running: its result was lost with the process, but it did not
kill it. It goes back to `ready` uncounted, like a mate that never started.
Before the audit the pipeline cleared a job's "running" mark only when it
settled the job (up to 50 ms after its handler returned, longer while other
handlers ran), so quick mates finished beside a crashing job were charged a
rescue and an attempt on every crash, and the three that always ran beside it
were dead-lettered with it (reproduced with `run-until-idle` at its default
concurrency of 4, lease 1 s, crash job among 10 healthy ones).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jobspool import JobState
from tests.cli_harness import run_jobspool
from tests.spools import make_spool
from tests.subproc import REPO, cli_env
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

# A worker of concurrency 4 claims the crash job and three mates (batch of 4). The mates
# return at once; their settle is held back (a settle waits while any handler runs, and
# here for an hour), so when the crash comes their results are not on disk yet. The crash
# handler waits until the mates have run and until this process's liveness file no longer
# lists them as running (10 s at most: the old code never clears them before the settle).
_CRASH_AFTER_MATES = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import orjson
    from jobspool import Spool, Worker
    from jobspool.queue import liveness, pipeline

    pipeline.SETTLE_SECONDS = 3600.0
    root = Path(sys.argv[1])
    ran = root.parent / "ran.log"

    def work(job, ctx):
        with open(ran, "a") as f:
            f.write(job.id + "\\n")
        return "ok"

    def crash(job, ctx):
        mark = root / "live" / (liveness.process_ident() + ".lock")
        deadline = time.monotonic() + 10  # a guard: the mates' marks should clear at once
        while time.monotonic() < deadline:
            mates = ran.read_text().split() if ran.exists() else []
            if len(mates) == 3 and orjson.loads(mark.read_bytes())["running"] == [ctx.token]:
                break
            time.sleep(0.01)
        os._exit(70)

    with Spool(root) as spool:
        Worker(spool, {"work": work, "crash": crash}, concurrency=4,
               batch_size=4).run_until_idle()
""")


def test_mates_whose_handlers_returned_before_the_crash_go_back_uncounted(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=3600) as spool:
        spool.enqueue("crash", job_id="a-crash", priority=-1)
        for i in range(3):
            spool.enqueue("work", job_id=f"w{i}")
    proc = subprocess.run([sys.executable, "-c", _CRASH_AFTER_MATES, str(root)], cwd=REPO,
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 70, proc.stderr
    assert sorted((tmp_path / "ran.log").read_text().split()) == ["w0", "w1", "w2"]
    with make_spool(root) as spool:
        report = spool.recover()  # the holder is provably dead: settled at once
        got = {j.id: (j.state, j.attempts, j.rescues) for j in spool.jobs()}
    assert list(report.leases_reclaimed) == ["a-crash"], report
    assert sorted(report.leases_returned) == ["w0", "w1", "w2"], report
    assert got == {"a-crash": (JobState.RETRYABLE, 1, 1),
                   "w0": (JobState.READY, 0, 0), "w1": (JobState.READY, 0, 0),
                   "w2": (JobState.READY, 0, 0)}


def test_a_crashing_job_among_ten_at_default_concurrency_dead_letters_only_itself(
        tmp_path: Path) -> None:
    # The issue's reproduction through the CLI, as a service would run it: `recover`, then
    # `run-until-idle` with every default but the lease, until nothing is left to run.
    root, log = tmp_path / "spool", tmp_path / "runs.log"
    with make_spool(root, lease_seconds=1.0, retry_base_seconds=0.01,
                    retry_max_seconds=0.01) as spool:
        spool.enqueue("crash", job_id="a-crash", priority=-1)
        for i in range(10):
            spool.enqueue("work", job_id=f"w{i:02d}")

    env = {"JOBSPOOL_TEST_LOG": str(log)}
    for _ in range(13):
        assert run_jobspool("recover", root=root, env=env).returncode == 0
        run_jobspool("run-until-idle", "--app", "tests.apps.crashy:app", "--wait-retries", "3",
                     root=root, env=env)
        with make_spool(root) as spool:
            if all(j.terminal for j in spool.jobs()):
                break
    with make_spool(root) as spool:
        states = {j.id: j.state for j in spool.jobs()}
    assert states.pop("a-crash") is JobState.DEAD_LETTER
    assert states == {f"w{i:02d}": JobState.COMPLETED for i in range(10)}


# A process that claims by hand and does the work itself (no Worker, so it never says
# which handlers it started) and that the job kills, every time.
_BARE_CLAIMER = textwrap.dedent("""
    import os, sys
    from jobspool import Spool
    spool = Spool(sys.argv[1])
    for lease in spool.claim(limit=10):
        os._exit(139)  # the job's work brings the process down (a segfault, the OOM killer)
""")


def test_a_job_that_kills_a_bare_claim_loop_is_counted_and_dead_lettered(
        tmp_path: Path) -> None:
    # Found in the audit: a process that never reported a handler start left "running: []"
    # in its liveness file, which recovery read as "none of its jobs started": the poison
    # job came back uncounted on every crash, forever, and never reached dead_letter.
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=3600, max_attempts=3, retry_base_seconds=0.0,
                    retry_max_seconds=0.0) as spool:
        spool.enqueue("poison", job_id="p")
    seen = []
    for _ in range(6):
        proc = subprocess.run([sys.executable, "-c", _BARE_CLAIMER, str(root)], cwd=REPO,
                              env=cli_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode in (0, 139), proc.stderr
        with make_spool(root) as spool:
            report = spool.recover()
            job = spool.get("p")
        seen.append((job.state, job.attempts))
        assert report.leases_returned == (), "a dead bare claimer's lease came back uncounted"
        if job.state is JobState.DEAD_LETTER:
            break
    assert seen == [(JobState.RETRYABLE, 1), (JobState.RETRYABLE, 2),
                    (JobState.DEAD_LETTER, 3)], seen


# A worker "in another container": its own PID and UTS namespaces (another hostname), the
# same kernel and the same volume. It stages a producer's file, claims a job, and dies.
_CONTAINER_WORKER = textwrap.dedent("""
    import os, sys
    from jobspool import Spool
    spool = Spool(sys.argv[1])
    spool.store.prestage([b'{"staged": "by a producer that died"}'])
    [lease] = spool.claim(limit=1)
    os._exit(137)  # the container was killed
""")


def test_recover_in_one_container_takes_back_what_a_dead_one_held_at_once(
        tmp_path: Path) -> None:
    # Found in the audit: a dead process whose liveness file named another hostname was
    # "unknown" (it might be another machine's), so a container's leases waited for
    # `lease_seconds` and its staged files for ten minutes. Containers on one host share
    # the kernel, hence its boot id and its flock: an unlocked file there is proof.
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=3600) as spool:
        spool.enqueue("work", job_id="j0")
    probe = subprocess.run(["unshare", "--uts", "--pid", "--fork", "true"],
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, f"this test needs `unshare --uts --pid` (root): {probe.stderr}"
    proc = subprocess.run(
        ["unshare", "--uts", "--pid", "--fork", "sh", "-c",
         'hostname another-container && exec "$0" -c "$1" "$2"', sys.executable,
         _CONTAINER_WORKER, str(root)],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 137, proc.stderr
    assert [p.name for p in (root / "tmp").iterdir() if p.is_file()], "nothing was staged"
    with make_spool(root) as spool:
        report = spool.recover()
        job = spool.get("j0")
    assert list(report.leases_reclaimed) == ["j0"], report
    assert (job.state, job.attempts, job.rescues) == (JobState.RETRYABLE, 1, 1)
    assert [p.name for p in (root / "tmp").iterdir() if p.is_file()] == []


def test_the_issues_run_until_idle_loop_without_recover_dead_letters_only_the_crashing_job(
        tmp_path: Path) -> None:
    # Found in the audit, after the fixes above: with no `recover` between runs, a claim
    # takes the dead worker's expired leases back together, in the same order, so the
    # crash job and the three mates that run beside it (concurrency 4) were all running
    # when the process died, every time, and the mates ran out of attempts with it. A job
    # that was running when a worker died now runs alone until it settles: if it kills the
    # next worker too, it is the only one running there, and the only one charged.
    root = tmp_path / "spool"
    with make_spool(root, lease_seconds=1.0) as spool:
        spool.enqueue("crash", job_id="a-crash")
        for i in range(10):
            spool.enqueue("work", job_id=f"w{i:02d}")
    deadline = time.monotonic() + 120  # guards against a hang only
    while time.monotonic() < deadline:
        proc = run_jobspool("run-until-idle", "--app", "tests.apps.crashy:app", root=root)
        assert proc.returncode in (0, 70), proc.stderr
        with make_spool(root) as spool:
            jobs = list(spool.jobs())
        if all(j.terminal for j in jobs):
            break
        # The dead worker's leases come back once they expire (no `recover` here).
        last = max((j.lease.expires_at for j in jobs if j.lease is not None), default=0.0)
        wait_until(lambda last=last: time.time() >= last, max(deadline - time.monotonic(), 0.0),
                   "the dead worker's leases to expire")
    states = {j.id: j.state for j in jobs}
    assert states.pop("a-crash") is JobState.DEAD_LETTER
    assert states == {f"w{i:02d}": JobState.COMPLETED for i in range(10)}
