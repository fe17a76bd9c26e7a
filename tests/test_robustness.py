"""Regression tests for issue 10: no single job, caller, fault or operator slip stops the
queue or loses a job (items 1, 2, 3, 7, 8, 9; items 4-6 are covered in their own files).

Each test reproduces one case the issue reported on the code of its day.

BUG found while writing these (not in the issue; last test; fixed in 3787b1c):
a stale duplicate of a job beside its expired lease made `claim` spin forever.
`leasing._claim_locked` skips a candidate whose id is already in `picked`
(`if any(p.id == c.job_id for p in picked): continue`) without forgetting it
from the index or adding it to `skipped`, so `candidates()` hands it back on
every pass; once it is the only candidate left, `while len(picked) < limit`
never ends. Reached when `ready/x.json` (older revision) and an expired
`leased/x.json` coexist while the lock's suspect flag is clear (a power loss,
or `.lock` deleted and recreated), e.g. by `run-until-idle` before `recover`.
Taking the stale ready copy at all is the other half: without the suspect
flag nothing compares revisions, so the older snapshot is the one claimed.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import Worker
from jobspool.errors import JobTooLarge, SpoolError
from tests.cli_harness import one_error_line, run_jobspool
from tests.helpers_spool import FakeClock, job_files, read_raw, tmp_leftovers
from tests.spools import make_spool
from tests.subproc import REPO, cli_env
from tests.waiting import wait_until

# ---------------------------------------------------------------- item 1: sizes


def _largest_payload(tmp: Path, *, priority: int = 0) -> int:
    """The longest string payload `enqueue` accepts for job `big01` of kind `big` created
    at FakeClock's start: probed on a scratch spool with ids of the same length, so the
    serialized sizes match to the byte."""
    lo, hi = 0, 70_000
    with make_spool(tmp / "probe", clock=FakeClock()) as probe:
        while lo < hi:
            mid = (lo + hi + 1) // 2
            try:
                probe.enqueue("big", {"p": "x" * mid}, job_id=f"p{mid:04d}"[-5:],
                              priority=priority)
            except JobTooLarge:
                hi = mid - 1
            else:
                lo = mid
    assert lo > 1000
    return lo


def test_a_job_accepted_at_the_size_limit_can_be_claimed_failed_canceled_and_completed(
        tmp_path: Path) -> None:
    clock = FakeClock()
    size = _largest_payload(tmp_path)
    with make_spool(tmp_path / "spool", clock=clock, lease_seconds=30.0) as spool:
        job = spool.enqueue("big", {"p": "x" * size}, job_id="big01")
        [lease] = spool.claim(limit=1)
        lease = spool.heartbeat(lease)
        failed = spool.fail(lease, "E" * 10_000)  # a long error is cut to fit
        assert failed.state == "retryable" and failed.last_error
        assert len(failed.last_error) <= 1024
        clock.advance(3600)
        [lease] = spool.claim(limit=1)
        assert spool.cancel(job.id).state == "canceled"
        assert spool.requeue(job.id).state == "ready"
        [lease] = spool.claim(limit=1)
        done = spool.complete(lease, None)
        assert done.state == "completed" and done.payload == {"p": "x" * size}


def test_a_batch_with_a_job_at_the_size_limit_completes_every_job(tmp_path: Path) -> None:
    size = _largest_payload(tmp_path, priority=-1)
    with make_spool(tmp_path / "spool", lease_seconds=30.0,
               clock=FakeClock()) as spool:
        spool.enqueue("big", {"p": "x" * size}, job_id="big01", priority=-1)
        small = [spool.enqueue("small", {"i": i}).id for i in range(5)]
        handlers = {"big": lambda job, ctx: None, "small": lambda job, ctx: {"ok": True}}
        report = Worker(spool, handlers=handlers, concurrency=2, batch_size=10).run_until_idle()
        assert report.completed == 6
        assert {j.id for j in spool.jobs(state="completed")} == {"big01", *small}


def test_a_handler_failing_with_a_long_message_on_a_job_at_the_limit_is_retried(
        tmp_path: Path) -> None:
    clock = FakeClock()
    size = _largest_payload(tmp_path, priority=-1)
    runs: list[int] = []

    def big(job: Any, ctx: Any) -> None:
        runs.append(job.attempts)
        if len(runs) == 1:
            raise RuntimeError("E" * 10_000)  # message and traceback are cut to fit

    with make_spool(tmp_path / "spool", lease_seconds=30.0, clock=clock) as spool:
        spool.enqueue("big", {"p": "x" * size}, job_id="big01", priority=-1)
        small = [spool.enqueue("small", {"i": i}).id for i in range(5)]
        worker = Worker(spool, handlers={"big": big, "small": lambda job, ctx: None},
                        concurrency=2, batch_size=10)
        first = worker.run_until_idle()
        assert (first.completed, first.retried) == (5, 1)
        failed = spool.get("big01")
        assert failed.state == "retryable" and failed.last_error
        assert len(failed.last_error) <= 1024
        clock.advance(3600)
        assert worker.run_until_idle().completed == 1
        assert {j.id for j in spool.jobs(state="completed")} == {"big01", *small}


def test_a_result_that_does_not_fit_dead_letters_that_job_alone(tmp_path: Path) -> None:
    with make_spool(tmp_path / "spool", lease_seconds=30.0,
               clock=FakeClock()) as spool:
        huge = spool.enqueue("huge", {}, job_id="huge1", priority=-1)
        small = [spool.enqueue("small", {"i": i}).id for i in range(5)]
        handlers = {"huge": lambda job, ctx: {"blob": "x" * 100_000},
                    "small": lambda job, ctx: {"ok": True}}
        report = Worker(spool, handlers=handlers, concurrency=2, batch_size=10).run_until_idle()
        assert report.completed == 5
        assert {j.id for j in spool.jobs(state="completed")} == set(small)
        gone = spool.get(huge.id)
        assert gone.state == "dead_letter" and gone.last_error, gone
        assert "max_job_bytes" in gone.last_error or "large" in gone.last_error.lower()


def test_max_job_bytes_given_at_creation_is_saved_and_used_by_later_openers(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root, max_job_bytes=4096):
        pass
    doc = orjson.loads((root / "spool.json").read_bytes())
    assert doc["settings"]["max_job_bytes"] == 4096
    with make_spool(root) as later:
        assert later.max_job_bytes == 4096
        with pytest.raises(JobTooLarge):
            later.enqueue("big", {"p": "x" * 5000})
        assert later.enqueue("small", {"p": "x" * 1000}).state == "ready"


# ---------------------------------------------------------------- item 2: staging names


def test_eight_threads_each_with_its_own_spool_on_one_root_enqueue_without_collisions(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    start = threading.Barrier(8)
    errors: list[BaseException] = []
    ids: list[list[str]] = [[] for _ in range(8)]

    def produce(n: int) -> None:
        try:
            with make_spool(root) as mine:
                start.wait()
                for i in range(250):
                    ids[n].append(mine.enqueue("work", {"t": n, "i": i}).id)
        except BaseException as exc:  # collected: the assertion below names them
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], f"{len(errors)} producers failed, first: {errors[:1]!r}"
    all_ids = [i for part in ids for i in part]
    assert len(set(all_ids)) == 2000
    assert sorted(job_files(root)) == sorted(all_ids)
    assert all(states == ["ready"] for states in job_files(root).values())
    assert tmp_leftovers(root) == []


_STAGER = """
import sys
from jobspool import Spool
spool = Spool(sys.argv[1])
[path] = spool.store.prestage([b'{"staged": "by a live producer"}'])
print(path, flush=True)
sys.stdin.read()  # stay alive (holding whatever marks us alive) until the test is done
"""


def test_a_live_producers_staged_file_survives_recover_from_another_pid_namespace(
        tmp_path: Path) -> None:
    # Real PID namespaces: the producer is pid 2 in its own (a shell is its pid 1), recover
    # runs as pid 1 in another, where no pid 2 exists. A pid lookup calls the producer dead.
    root = tmp_path / "spool"
    make_spool(root).close()
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True,
                           text=True, timeout=60)
    assert probe.returncode == 0, f"this test needs `unshare --pid` (root): {probe.stderr}"
    producer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "sh", "-c", '"$0" -c "$1" "$2"; true',
         sys.executable, _STAGER, str(root)],
        cwd=REPO, env=cli_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert producer.stdout is not None
        staged = Path(producer.stdout.readline().strip())
        assert staged.exists() and root / "tmp" in staged.parents, staged
        recover = run_jobspool("recover", root=root, prefix=("unshare", "--pid", "--fork"))
        assert recover.returncode == 0, recover.stderr
        assert staged.exists(), "recover deleted a live producer's staged file"
    finally:
        producer.communicate(input="", timeout=60)


# ---------------------------------------------------------------- item 3: deleting .lock

_HOLDER = """
import os, sys, time
from jobspool import Spool
root, marks, who = sys.argv[1], sys.argv[2], sys.argv[3]
def mark(text):
    fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, (who + " " + text + "\\n").encode())
    os.close(fd)
def seen(text):
    return text in open(marks).read().split("\\n")
if who == "B":
    mark("try")  # before opening: should opening itself wait for the lock, A must not wait
spool = Spool(root)
with spool.lock.hold():
    mark("in")
    if who == "A":
        while not seen("B try"):  # the test deleted .lock and started B meanwhile
            time.sleep(0.01)
        time.sleep(0.5)  # B's window to (wrongly) get in while A still holds the lock
    mark("out")
"""


def test_deleting_the_lock_file_never_lets_a_second_process_hold_the_lock(
        tmp_path: Path) -> None:
    root, marks = tmp_path / "spool", tmp_path / "marks.log"
    make_spool(root).close()

    def holder(who: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", _HOLDER, str(root), str(marks), who],
                                cwd=REPO, env=cli_env(), stderr=subprocess.PIPE, text=True)

    a = holder("A")
    wait_until(lambda: marks.exists() and "A in" in marks.read_text(), 60, "A to hold the lock",
               proc=a)
    os.unlink(root / ".lock")  # the operator reflex
    b = holder("B")
    for p in (a, b):
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    order = marks.read_text().split("\n")[:-1]
    assert order == ["A in", "B try", "A out", "B in", "B out"], (
        f"B held the lock while A did: {order}")


def test_fsck_reports_a_job_file_holding_another_jobs_content(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {"n": 1}, job_id="first")
        spool.enqueue("work", {"n": 2}, job_id="second")
    (root / "ready" / "second.json").write_bytes((root / "ready" / "first.json").read_bytes())
    proc = run_jobspool("--json", "fsck", root=root)
    report = orjson.loads(proc.stdout)
    assert proc.returncode == 2 and not report["ok"], report
    assert any("second" in str(p) for p in report["problems"]), report["problems"]


# ---------------------------------------------------------------- item 7: OS errors


def test_flock_failing_with_enolck_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    proc = run_jobspool("enqueue", "work", "{}", root=root,
                        prefix=("strace", "-f", "-qq", "-o", "/dev/null", "-e",
                                "inject=flock:error=ENOLCK"))
    line = one_error_line(proc)
    assert "lock" in line.lower(), line


def test_enospc_on_enqueue_names_the_path_and_what_to_do(tmp_path: Path) -> None:
    root, trace = tmp_path / "spool", tmp_path / "write.trace"
    make_spool(root).close()
    # Which write(2) of an enqueue writes the job file: learned from an unfaulted enqueue of
    # a job with an id of the same length, then that call fails with ENOSPC.
    calibrate = run_jobspool("enqueue", "work", '{"n": 1}', "--id", "probe1", root=root,
                             prefix=("strace", "-f", "-qq", "-o", str(trace), "-e", "trace=write"))
    assert calibrate.returncode == 0, calibrate.stderr
    writes = [line for line in trace.read_text().splitlines() if " write(" in line]
    n = next(i for i, line in enumerate(writes, 1) if '\\"id\\":\\"probe1' in line)
    proc = run_jobspool("enqueue", "work", '{"n": 1}', "--id", "probe2", root=root,
                        prefix=("strace", "-f", "-qq", "-o", "/dev/null", "-e",
                                f"inject=write:error=ENOSPC:when={n}"))
    line = one_error_line(proc)
    assert str(root) in line, line
    assert re.search(r"(?i)\bfree\b|make room|clean up|delete|remove|prune", line), line
    assert job_files(root) == {"probe1": ["ready"]} and tmp_leftovers(root) == []


# ---------------------------------------------------------------- item 8: tmp/


def test_recover_removes_a_stray_file_in_tmp(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="kept")
        (root / "tmp" / "partial.json").write_bytes(b'{"id": "par')
        spool.recover()
    assert not (root / "tmp" / "partial.json").exists()
    assert tmp_leftovers(root) == []
    assert job_files(root) == {"kept": ["ready"]}


def test_enqueue_many_with_one_id_twice_returns_what_it_stored_and_leaves_no_temp_file(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        jobs = spool.enqueue_many("work", [{"n": 1}, {"n": 2}], job_ids=["twice", "twice"])
        stored = spool.get("twice")
        assert len(jobs) == 2
        for job in jobs:
            assert (job.id, job.payload, job.revision) == (stored.id, stored.payload,
                                                           stored.revision)
        assert read_raw(root, "ready", "twice")["payload"] == stored.payload
    assert job_files(root) == {"twice": ["ready"]}
    assert tmp_leftovers(root) == []


# ---------------------------------------------------------------- item 9: permissions

_UNDER_UMASK_0 = """
import os, sys, time
os.umask(0)
from jobspool import Spool
root, access, tag = sys.argv[1], sys.argv[2], sys.argv[3]
kwargs = {} if access == "-" else {"access": access}
with Spool(root, lease_seconds=30.0, retry_base_seconds=0.0, retry_max_seconds=0.0,
           **kwargs) as spool:
    for n in range(10):
        spool.enqueue("work", {"n": n}, job_id=f"{tag}{n}")
    leases = []
    for _ in range(10):
        if len(leases) < 10:
            leases += spool.claim(limit=10 - len(leases))
    assert len(leases) == 10, leases
    for lease in leases[:5]:
        spool.complete(lease, {"ok": True})
    for lease in leases[5:8]:
        spool.fail(lease, "boom", retryable=False)
    spool.cancel(leases[8].job_id)
    spool.recover()
"""


def _modes(root: Path) -> Iterator[tuple[Path, int, bool]]:
    yield root, root.stat().st_mode, True
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = Path(dirpath) / d
            yield p, p.lstat().st_mode, True
        for f in filenames:
            p = Path(dirpath) / f
            yield p, p.lstat().st_mode, False


def _in_umask_0(root: Path, access: str, tag: str = "a") -> None:
    proc = subprocess.run([sys.executable, "-c", _UNDER_UMASK_0, str(root), access, tag], cwd=REPO,
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_new_spool_is_private_whatever_the_umask(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    _in_umask_0(root, "-")
    wrong = [(str(p.relative_to(root.parent)), oct(stat.S_IMODE(m)))
             for p, m, is_dir in _modes(root)
             if stat.S_IMODE(m) != (0o700 if is_dir else 0o600)]
    assert wrong == [], f"not 0700 dirs / 0600 files: {wrong}"


_MAINTAIN_UNDER_UMASK_0 = """
import os, sys
os.umask(0)
from jobspool import Spool, Worker
from jobspool.projection.lance import ProjectionStore
from jobspool.projection.maintenance import maintain
root = sys.argv[1]
with Spool(root) as spool:
    spool.enqueue("doc", {"n": 1})
    Worker(spool, {"doc": lambda job, ctx: ctx.upsert("docs", {"id": job.id, "n": 1})}
           ).run_until_idle()
    maintain(ProjectionStore(os.path.join(root, "index")))
"""


def test_jobspools_own_files_in_the_default_projection_are_private_whatever_the_umask(
        tmp_path: Path) -> None:
    # Found in a README walk-through: the maintenance record and its lock followed the
    # umask (0666 under umask 0) where the README says index/ is private like the spool.
    root = tmp_path / "spool"
    proc = subprocess.run([sys.executable, "-c", _MAINTAIN_UNDER_UMASK_0, str(root)],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    index = root / "index"
    assert stat.S_IMODE(index.stat().st_mode) == 0o700
    ours = sorted(index.glob(".jobspool-maintenance*"))
    assert [p.name for p in ours] == [".jobspool-maintenance.json", ".jobspool-maintenance.lock"]
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in ours} == {
        p.name: oct(0o600) for p in ours}


def test_a_group_spool_is_shared_with_the_group_and_remembers_it(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    _in_umask_0(root, "group")
    assert "group" in (root / "spool.json").read_text()
    _in_umask_0(root, "-", "b")  # a later opener that does not say `access` keeps the group's modes
    assert root.stat().st_mode & stat.S_ISGID, "the root of a group spool is not setgid"
    wrong = [(str(p.relative_to(root.parent)), oct(stat.S_IMODE(m)))
             for p, m, is_dir in _modes(root)
             if stat.S_IMODE(m) & 0o777 != (0o770 if is_dir else 0o660)]
    assert wrong == [], f"not 0770 dirs / 0660 files: {wrong}"


def test_a_state_directory_writable_by_others_is_refused_with_one_line(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    ready = root / "ready"
    ready.chmod(ready.stat().st_mode | stat.S_IWOTH)
    with pytest.raises(SpoolError) as info:
        make_spool(root)
    assert str(ready) in str(info.value) and "\n" not in str(info.value)
    proc = run_jobspool("enqueue", "work", "{}", root=root)
    assert proc.returncode == 2
    assert str(ready) in one_error_line(proc)
    assert job_files(root) == {}


# ---------------------------------------------------------------- found meanwhile

_CLAIM = """
import sys
from jobspool import Spool
with Spool(sys.argv[1]) as spool:
    first = [lease.job_id for lease in spool.claim(limit=10)]
    # The claim that meets the duplicate may leave that job for the next one.
    print(sorted(first + [lease.job_id for lease in spool.claim(limit=10)]))
"""


def test_a_stale_duplicate_beside_an_expired_lease_does_not_wedge_claim(tmp_path: Path) -> None:
    # A crash between a claim's rename and its unlink left ready/x.json (the older revision)
    # beside leased/x.json, whose holder died long ago. The claim loop took the stale copy,
    # then skipped the leased candidate without forgetting it and asked for it forever.
    root = tmp_path / "spool"
    with make_spool(root, clock=lambda: time.time() - 1000, lease_seconds=30.0) as past:
        past.enqueue("work", {}, job_id="x", priority=-1)
        before = (root / "ready" / "x.json").read_bytes()
        [lease] = past.claim(limit=1)
    (root / "ready" / "x.json").write_bytes(before)
    with make_spool(root) as spool:
        for i in range(3):
            spool.enqueue("work", {}, job_id=f"r{i}")
    try:
        proc = subprocess.run([sys.executable, "-c", _CLAIM, str(root)], cwd=REPO,
                              env=cli_env(), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("claim spun for 60 s on a stale duplicate") from None
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(["r0", "r1", "r2", "x"]), "x lost or claimed twice"
    where: dict[str, Any] = job_files(root)
    assert where["x"] == ["leased"]
    assert read_raw(root, "leased", "x")["lease"]["token"] > lease.token
