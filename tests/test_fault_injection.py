"""Fault injection at every step of the store's write sequence, then recovery.

Every state change of the spool (and recovery itself) is interrupted at each
system call of its write sequence — each staging write, each fsync (of a
staged file, of a directory after the publishing renames, of a directory
after the old files were retired), each rename (publish, or retire into
`tmp/pool/`) and each unlink — in two ways:

- *raise*: the seam in `jobspool.queue.store` raises `EIO` at its n-th call
  and the process goes on with the same `Spool` (a failed disk, a full
  quota), with and without the pool of recycled files (without it, old files
  are unlinked instead of renamed);
- *exit*: a forked child `os._exit()`s just before the n-th call of any seam
  (a crash: no `finally`, no cleanup), and a fresh `Spool` opens the
  directory as a restarted process would.

After `recover()`, each job must be in exactly one state directory, in the
state (and revision) it had before the operation or the one it has after a
clean run of it — nothing lost, nothing torn — `tmp/` must be empty apart
from the pool, `fsck` must be clean, and the spool must still drain.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.errors import WriteFailed
from jobspool.queue import store as store_mod
from jobspool.recovery.quarantine import quarantined_files
from tests.helpers_spool import FakeClock, assert_disk_consistent, job_files, read_raw
from tests.spools import make_spool
from tests.waiting import wait_until

SEAMS = ("os_write", "os_fsync", "os_replace", "os_unlink")
T0 = 1_700_000_000.0
LEASE = 30.0


class Crash(Exception):
    """Raised in a forked child instead of returning to pytest."""


@dataclass
class Ctx:
    """What the setup hands to an operation: leases and reservations are plain data."""

    lease: Any
    reservation: Any
    stale_j2: bytes


def open_spool(root: Path, clock: FakeClock, *, durable: bool = True, pool: int = 256) -> Spool:
    s = make_spool(root, durable=durable, sync_mode="fsync", clock=clock, lease_seconds=LEASE, seed=7,
              max_attempts=3)
    s.store.pool_size = pool
    return s


def build(root: Path) -> Ctx:
    """j1 leased, j2 completed, j3 and j4 ready, j5 canceled, p1 prepared."""
    clock = FakeClock(T0)
    s = open_spool(root, clock, durable=False)
    try:
        s.enqueue_many("k", [{"i": i} for i in range(1, 6)], job_ids=["j1", "j2", "j3", "j4", "j5"])
        (l1,) = s.claim()
        (l2,) = s.claim()
        stale = (root / "leased" / "j2.json").read_bytes()
        s.complete(l2, {"done": 2})
        s.cancel("j5")
        r = s.prepare("k", {"p": 1}, job_id="p1")
        assert (l1.job_id, l2.job_id) == ("j1", "j2")
        return Ctx(lease=l1, reservation=r, stale_j2=stale)
    finally:
        s.close()


def plant_mess(root: Path, ctx: Ctx, clock: FakeClock) -> None:
    """What a crash leaves: a stale copy, a staging file, a torn file, an expired lease."""
    (root / "leased" / "j2.json").write_bytes(ctx.stale_j2)
    (root / "tmp" / "999.0.tmp").write_bytes(b'{"half":')
    (root / "ready" / "torn.json").write_bytes(b'{"v": 1, "id": "torn", "ki')
    clock.advance(LEASE + 1)


Op = Callable[[Spool, Ctx], object]

OPS: dict[str, Op] = {
    "enqueue_many": lambda s, c: s.enqueue_many("k", [1, 2, 3], job_ids=["n1", "n2", "n3"]),
    "claim_two": lambda s, c: s.claim(limit=2),
    "complete": lambda s, c: s.complete(c.lease, {"ok": 1}),
    "fail_retryable": lambda s, c: s.fail(c.lease, "boom"),
    "fail_permanent": lambda s, c: s.fail(c.lease, "boom", retryable=False),
    "release": lambda s, c: s.release(c.lease),
    "heartbeat": lambda s, c: s.heartbeat(c.lease),
    "cancel_leased": lambda s, c: s.cancel("j1"),
    "requeue": lambda s, c: s.requeue("j5"),
    "commit": lambda s, c: s.commit(c.reservation),
    "abort": lambda s, c: s.abort(c.reservation),
    "prune": lambda s, c: s.prune(keep=0),
    "recover": lambda s, c: s.recover(),
}


ADOPTING = frozenset({"claim_two", "complete", "fail_retryable", "fail_permanent", "heartbeat"})


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """id -> (state, revision) of every readable job file (one per id expected)."""
    out: dict[str, tuple[str, int]] = {}
    for job_id, states in job_files(root).items():
        if job_id == "torn":
            continue
        state = max(states, key=lambda st: read_raw(root, st, job_id)["revision"])
        out[job_id] = (state, int(read_raw(root, state, job_id)["revision"]))
    return out


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Ctx]:
    root = tmp_path_factory.mktemp("template") / "spool"
    return root, build(root)


def fresh(template: tuple[Path, Ctx], dest: Path, op: str) -> tuple[Path, Ctx, FakeClock]:
    src, ctx = template
    shutil.copytree(src, dest, symlinks=True)
    clock = FakeClock(T0)
    if op == "recover":
        plant_mess(dest, ctx, clock)
    return dest, ctx, clock


@dataclass
class Expectation:
    before: dict[str, tuple[str, int]]
    after: dict[str, tuple[str, int]]
    calls: dict[str, int]


def clean_run(template: tuple[Path, Ctx], dest: Path, op: str, pool: int) -> Expectation:
    root, ctx, clock = fresh(template, dest, op)
    before = snapshot(root)
    calls = dict.fromkeys(SEAMS, 0)
    originals = {name: getattr(store_mod, name) for name in SEAMS}

    def counting(name: str) -> Callable[..., Any]:
        def seam(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return originals[name](*args, **kwargs)
        return seam

    s = open_spool(root, clock, pool=pool)
    try:
        for name in SEAMS:
            setattr(store_mod, name, counting(name))
        OPS[op](s, ctx)
    finally:
        for name, fn in originals.items():
            setattr(store_mod, name, fn)
        s.close()
    return Expectation(before=before, after=snapshot(root), calls=calls)


def check_recovered(root: Path, clock: FakeClock, exp: Expectation, op: str, where: str,
                    spool: Spool | None = None) -> None:
    s = spool or open_spool(root, clock)
    # The checks that follow are not under test for durability: skip their flushes (speed).
    s.journal.durable = s.store.durable = False
    try:
        published = snapshot(root)  # the newest readable version of each job, as the crash left it
        s.recover()
        states = assert_disk_consistent(root)  # one file per job, fields match, tmp/ clean
        assert "torn" not in states, where
        got = snapshot(root)
        # A lease whose holder provably died (the crashed child, or a process whose liveness
        # file was copied with the spool) is taken back at once, one revision later: the
        # child claims by hand and never says which jobs it started, so the lease counts
        # (retryable); a Worker's unstarted ones would return to ready uncounted.
        returned = {j for j, v in published.items()
                    if v is not None and v[0] == "leased"
                    and got.get(j) in (("ready", v[1] + 1), ("retryable", v[1] + 1))}
        for job_id in exp.before.keys() | exp.after.keys():
            allowed = {exp.before.get(job_id), exp.after.get(job_id)}
            if op == "recover":
                allowed = {exp.after.get(job_id)}  # the second recovery finishes the first
                allowed |= {("ready", v[1]) for v in allowed if v and v[0] == "retryable"}
            if job_id in returned:
                allowed.add(got.get(job_id))
            assert got.get(job_id) in allowed, (
                f"{where}: job {job_id} is {got.get(job_id)}, expected one of {allowed}")
        assert set(got) <= exp.before.keys() | exp.after.keys(), where
        if op != "recover":
            # Recovery never goes back: a version that was published survives (but a dead
            # holder's lease, returned as above).
            kept = {j: v for j, v in got.items() if j not in returned}
            assert kept == {j: v for j, v in published.items() if j not in returned}, (
                f"{where}: recovery changed {published} into {got}")
        if op == "recover":
            assert len(quarantined_files(s)) == 1, where
        report = s.fsck()
        assert report.ok, f"{where}: {report.problems}"
        assert not s.recover().changed, f"{where}: a second recovery still found work"
        _drain(s, clock)
    finally:
        s.close()


def _drain(s: Spool, clock: FakeClock) -> None:
    """Every job that can run still runs to completion after the crash."""
    clock.advance(3600)
    for _ in range(20):
        leases = s.claim(limit=50)
        if not leases:
            break
        for lease in leases:
            s.complete(lease)
    for job in s.jobs():
        assert job.state in (JobState.COMPLETED, JobState.CANCELED, JobState.DEAD_LETTER,
                             JobState.PREPARED), job


@pytest.fixture
def cases(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    n = iter(range(10**6))
    yield lambda label: tmp_path / f"{label}-{next(n)}"


# ---------------------------------------------------------------- raise


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("pool", [256, 0], ids=["pool", "no-pool"])
def test_a_failing_syscall_at_any_step_leaves_old_or_new_state_after_recovery(
        op: str, pool: int, template: tuple[Path, Ctx], cases: Callable[[str], Path]) -> None:
    exp = clean_run(template, cases("clean"), op, pool)
    assert sum(exp.calls.values()) > 0
    injected = 0
    for seam in SEAMS:
        for n in range(1, exp.calls[seam] + 1):
            where = f"{op}: {seam} call {n} raises"
            root, ctx, clock = fresh(template, cases(f"{seam}-{n}"), op)
            s = open_spool(root, clock, pool=pool)
            original = getattr(store_mod, seam)
            count = 0

            def failing(*args: Any, _orig: Any = original, _n: int = n, **kwargs: Any) -> Any:
                nonlocal count
                count += 1
                if count == _n:
                    raise OSError(errno.EIO, "injected I/O error")
                return _orig(*args, **kwargs)

            setattr(store_mod, seam, failing)
            unretired = _Unretired()
            store_log.addHandler(unretired)
            try:
                try:
                    OPS[op](s, ctx)
                except (OSError, WriteFailed) as exc:
                    assert "injected" in str(exc), where
                else:
                    # The write failed after publishing: claims, settles and heartbeats
                    # adopt what reached the disk instead of reporting a failure; a
                    # change already flushed whose old copy stayed is done (and logged).
                    assert op in ADOPTING or unretired.seen, f"{where}: the failure went unreported"
            finally:
                setattr(store_mod, seam, original)
                store_log.removeHandler(unretired)
            injected += 1
            # The same process carries on: recovery with the very Spool that saw the error.
            check_recovered(root, clock, exp, op, where, spool=s)
    assert injected == sum(exp.calls.values())


class _Unretired(logging.Handler):
    """Notes the store's warning that a file it meant to remove stayed (a retire step
    failed): a superseded copy, or a job a prune or a recovery removes."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = False

    def emit(self, record: logging.LogRecord) -> None:
        self.seen = self.seen or "could not remove " in record.getMessage()


store_log = logging.getLogger(store_mod.__name__)


# ---------------------------------------------------------------- exit


def _crash_child(root: Path, ctx: Ctx, clock: FakeClock, op: str, n: int, pool: int) -> None:
    s = open_spool(root, clock, pool=pool)
    count = 0

    def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
        def seam(*args: Any, **kwargs: Any) -> Any:
            nonlocal count
            count += 1
            if count == n:
                os._exit(0)  # a crash: no cleanup, no lock release but the kernel's
            return orig(*args, **kwargs)
        return seam

    for name in SEAMS:
        setattr(store_mod, name, wrap(getattr(store_mod, name)))
    OPS[op](s, ctx)
    os._exit(3)  # ran to the end without reaching call n


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(OPS))
def test_a_crash_before_any_step_leaves_old_or_new_state_after_recovery(
        op: str, template: tuple[Path, Ctx], cases: Callable[[str], Path]) -> None:
    exp = clean_run(template, cases("clean"), op, 256)
    total = sum(exp.calls.values())
    for n in range(1, total + 2):  # total + 1: the operation ran through, then the process died
        where = f"{op}: process dies before seam call {n} of {total}"
        root, ctx, clock = fresh(template, cases(f"exit-{n}"), op)
        with warnings.catch_warnings():
            # Python >= 3.12 warns about fork() in a process with threads; the child runs
            # only this module's code and leaves through os._exit.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            try:
                _crash_child(root, ctx, clock, op, n, 256)
            finally:
                os._exit(4)
        code = _reap(pid, where)
        assert code == (3 if n > total else 0), f"{where}: child exit code {code}"
        check_recovered(root, clock, exp, op, where)


def _reap(pid: int, where: str, deadline_seconds: float = 60.0) -> int:
    """Wait for a forked child; a hang (a lock inherited mid-use) fails instead of blocking."""
    statuses: list[int] = []

    def exited() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            statuses.append(status)
        return bool(done)

    try:
        wait_until(exited, deadline_seconds, f"{where}: the forked child to exit", interval=0.001)
    except BaseException:  # it hung: end it before failing
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(statuses[0])


def test_the_clean_runs_touch_every_kind_of_seam(template: tuple[Path, Ctx],
                                                 cases: Callable[[str], Path]) -> None:
    """Guard against a vacuous suite: the write sequence really goes through each seam."""
    seen = dict.fromkeys(SEAMS, 0)
    for op in ("claim_two", "complete"):
        for pool in (256, 0):
            for name, k in clean_run(template, cases(op), op, pool).calls.items():
                seen[name] += k
    assert all(seen.values()), seen
