"""Faults injected from outside the process: the real `jobspool` CLI under `strace -e inject`.

The in-process fault tests (`test_fault_injection.py`) patch the store's
syscall seams; these leave the code alone and make the kernel's answer fail
instead: `strace -f -e inject=SYSCALL:error=ERRNO:when=N` turns the N-th
call of a syscall (counted per syscall and per thread) into EIO or ENOSPC,
wherever in jobspool, portalocker or Python it comes from.

Each case starts from the same spool — 12 ready jobs, 2 jobs whose leases
expired in a crashed worker (one with the stale duplicate a crash leaves in
`ready/`), and a stray `tmp/partial.json` — runs one command (`enqueue`,
`run-until-idle` or `recover`) with one fault, then does what an operator
or a service manager would: the failed `enqueue` is retried, `recover`
runs, a second, unfaulted `run-until-idle` drains the spool. Then:

- the faulted command either succeeded or printed one short line
  `jobspool: error: ...` (never a traceback);
- every job is completed, exactly once: one file, in `completed/`; the
  result of that file carries the token of the job's *last* run (a run
  after an accepted completion would be a second completion); tokens are
  never handed to two runs; and when no handler ran under the fault, each
  job ran exactly once;
- `fsck --json` reports no problem and `tmp/` holds nothing outside the
  recycling pool `tmp/pool/`.

BUG seen on the tree of 16:40 UTC (the `run` cases): the worker logs
`worker loop failed (...); restarting` with `exc_info=exc`
(jobspool/queue/worker.py, the `log.error` in the crash handler), so every
OS error inside a claim or settle puts a full traceback on stderr even when
it is already a one-line `WriteFailed`/`SpoolError`; and `SpoolLock.release`
lets a raw `OSError` from `flock(LOCK_UN)` escape (flock ENOSPC, N=3).

Runs are counted with `tests/apps/ledger.py`, whose handler appends one line
per run to an `O_APPEND` file and returns its token as the job's result.

`openat` is special: Python's startup opens hundreds of files before
jobspool runs, and failing one of those tests the interpreter, not the
spool. So for `openat` each case first runs the same command unfaulted
under `strace -e trace=openat` on a copy of the same spool, finds which of
the main thread's `openat` calls touch the spool (the 1st, 3rd, 10th of
them), and injects there. In `run-until-idle` most spool I/O happens on a
worker thread whose low call numbers coincide with the main thread's
import-time calls, so there the `openat` faults hit the main thread's
spool opens only; the other syscalls are not made at import time and hit
every thread from the first call on.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.cli_harness import run_jobspool, start_jobspool
from tests.helpers_spool import STATE_DIRS, job_files, read_raw, tmp_leftovers
from tests.spools import make_spool

pytestmark = pytest.mark.slow

SYSCALLS = {
    "fsync": "fsync",
    "rename": "rename,renameat,renameat2",
    "openat": "openat",
    "unlink": "unlink,unlinkat",
    "flock": "flock",
    "syncfs": "syncfs",
}
APP = "tests.apps.ledger:app"
RUN = ("run-until-idle", "--app", APP, "--concurrency", "2", "--batch-size", "10",
       "--no-maintenance")
DRAIN = ("run-until-idle", "--app", APP, "--no-maintenance", "--wait-retries", "10")
ENQUEUE = ("enqueue", "record", "{}", "--id", "e1")
COMMANDS: dict[str, tuple[str, ...]] = {"enqueue": ENQUEUE, "run": RUN, "recover": ("recover",)}
OLD_IDS = ["x0", "x1", *(f"r{i:02d}" for i in range(12))]


@dataclass(frozen=True)
class Case:
    command: str
    syscall: str
    errno: str
    n: int
    # Today's code surely makes this call at least n times in this command (else the
    # case still has to converge, but is not required to have been hit). In
    # `run-until-idle` the calls spread over a pool of threads, each counted apart, in
    # an order that varies: only n=1 is sure to be reached there.
    must_hit: bool = True

    @property
    def required(self) -> bool:
        return self.must_hit and (self.command != "run" or self.n == 1)

    def __str__(self) -> str:
        return f"{self.command}-{self.syscall}-{self.errno}-{self.n}"


CASES = [
    # enqueue: one staged file, its fsync, the rename, the directory fsync, the lock.
    Case("enqueue", "fsync", "EIO", 1), Case("enqueue", "fsync", "ENOSPC", 2),
    Case("enqueue", "rename", "EIO", 1), Case("enqueue", "rename", "ENOSPC", 1),
    Case("enqueue", "openat", "EIO", 1), Case("enqueue", "openat", "ENOSPC", 3),
    Case("enqueue", "openat", "EIO", 10),
    Case("enqueue", "flock", "EIO", 1), Case("enqueue", "flock", "EIO", 3),
    # run-until-idle: claims (syncfs for batches of 8 and more), settles, lease checks.
    Case("run", "fsync", "EIO", 1), Case("run", "fsync", "ENOSPC", 3),
    Case("run", "fsync", "EIO", 10, must_hit=False),
    Case("run", "rename", "EIO", 1), Case("run", "rename", "ENOSPC", 3),
    Case("run", "rename", "EIO", 10, must_hit=False),
    Case("run", "openat", "EIO", 1), Case("run", "openat", "ENOSPC", 3),
    Case("run", "flock", "EIO", 1), Case("run", "flock", "ENOSPC", 3),
    Case("run", "flock", "EIO", 10, must_hit=False),
    Case("run", "syncfs", "EIO", 1), Case("run", "syncfs", "ENOSPC", 3),
    Case("run", "unlink", "EIO", 1, must_hit=False),
    # recover: duplicate resolution, expired leases, the stray temp file.
    Case("recover", "fsync", "EIO", 1), Case("recover", "fsync", "ENOSPC", 3),
    Case("recover", "rename", "EIO", 1), Case("recover", "rename", "ENOSPC", 3),
    Case("recover", "openat", "EIO", 1), Case("recover", "openat", "ENOSPC", 3),
    Case("recover", "openat", "EIO", 10),
    Case("recover", "unlink", "EIO", 1, must_hit=False),
    Case("recover", "unlink", "ENOSPC", 1, must_hit=False),
    Case("recover", "flock", "EIO", 1), Case("recover", "flock", "ENOSPC", 3),
    Case("recover", "syncfs", "EIO", 1, must_hit=False),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The starting spool of every case (copied per case, never touched itself)."""
    assert shutil.which("strace"), "strace is required (.ci/run installs it)"
    root = tmp_path_factory.mktemp("strace-template") / "spool"
    opts: dict[str, Any] = dict(lease_seconds=30.0, max_attempts=50, retry_base_seconds=0.01,
                                retry_max_seconds=0.05, keep_terminal=100_000,
                                max_rescues=None)
    # Two jobs claimed by a worker that is gone, long ago: their leases have expired.
    with make_spool(root, clock=lambda: time.time() - 1000, **opts) as past:
        for i in range(2):
            past.enqueue("record", {}, job_id=f"x{i}", priority=-1)
        before = (root / "ready" / "x0.json").read_bytes()
        leases = past.claim(limit=2)
        assert sorted(lease.job_id for lease in leases) == ["x0", "x1"]
    (root.parent / "x0.stale.json").write_bytes(before)  # see _copy
    with make_spool(root) as spool:
        for i in range(12):
            spool.enqueue("record", {}, job_id=f"r{i:02d}")
    # Left in tmp/ by an older version or a person (DESIGN §6: stale temp files go).
    (root / "tmp" / "partial.json").write_bytes(b'{"id": "par')
    return root


def _copy(template: Path, root: Path, command: str) -> None:
    """A fresh copy of the starting spool, with the duplicate a crash between the rename and
    the unlink of the claim of x0 left behind (`recover` and claims must both cope)."""
    shutil.copytree(template, root, symlinks=True)
    shutil.copyfile(template.parent / "x0.stale.json", root / "ready" / "x0.json")


def _jobspool(root: Path, log: Path, args: tuple[str, ...], *, strace: list[str] | None = None,
              ) -> tuple[int, str, int]:
    """Run the CLI (under strace when given); (exit code, stderr, pid of the CLI process
    or of strace around it)."""
    env: dict[str, str | None] = {"JOBSPOOL_TEST_LOG": str(log), "PYTHONDONTWRITEBYTECODE": "1"}
    # A session of its own: on a hang, the whole group (strace and the traced CLI) is killed,
    # not just strace, whose death would leave the CLI running detached.
    proc = start_jobspool(*args, root=root, env=env, prefix=strace or (),
                          stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"jobspool {' '.join(args)} hung for 120 s (killed)") from None
    return proc.returncode, err.decode(errors="replace"), proc.pid


_OPENAT = re.compile(r'^(\d+)\s+openat\(AT_FDCWD, "([^"]*)"')


def _spool_openat_numbers(template: Path, tmp: Path, command: str) -> list[int]:
    """The main thread's `openat` call numbers (1-based, as strace counts) that open a
    path inside the spool, in an unfaulted run of `args` on a copy of the template."""
    root = tmp / "calibrate"
    _copy(template, root, command)
    trace = tmp / "calibrate.trace"
    rc, err, _ = _jobspool(root, tmp / "calibrate.log", COMMANDS[command],
                           strace=["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=openat"])
    assert rc == 0, err
    main_tid: str | None = None
    count = 0
    numbers: list[int] = []
    for line in trace.read_text().splitlines():
        m = _OPENAT.match(line)
        if m is None:
            continue
        tid, path = m.groups()
        main_tid = main_tid or tid
        if tid != main_tid:
            continue
        count += 1
        if path == str(root) or path.startswith(str(root) + "/"):
            numbers.append(count)
    assert numbers, "the calibration run opened nothing in the spool"
    return numbers


def _ledger(log: Path) -> list[tuple[str, int, int]]:
    """(job id, token, pid) of every run, in the order the runs started."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        what, job_id, token, pid = line.split()
        assert what == "run", line
        out.append((job_id, int(token), int(pid)))
    return out


def _head(text: str, lines: int = 12) -> str:
    return "\n".join(text.splitlines()[:lines])


def _assert_short_message(case: Case, rc: int, err: str) -> None:
    assert "Traceback" not in err and '  File "' not in err, (
        f"{case}: a traceback on stderr:\n{_head(err)}")
    if rc == 0:
        return
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("jobspool: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], (
        f"{case}: exit {rc} without exactly one closing 'jobspool: error:' line:\n{_head(err)}")
    if case.command != "run":  # a worker may log what it retried; the others say one thing
        assert len(lines) == 1, f"{case}: more than one line on stderr:\n{_head(err)}"
    assert len(errors[0]) < 400, f"{case}: the message is not short: {errors[0]!r}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_after_a_fault_in_any_syscall_recover_and_a_second_run_complete_every_job_once(
        case: Case, template: Path, tmp_path: Path) -> None:
    root, log = tmp_path / "spool", tmp_path / "runs.log"
    _copy(template, root, case.command)
    args = COMMANDS[case.command]
    n = case.n
    if case.syscall == "openat":
        numbers = _spool_openat_numbers(template, tmp_path, case.command)
        n = numbers[min(case.n, len(numbers)) - 1]
    trace = tmp_path / "fault.trace"
    rc, err, _ = _jobspool(root, log, args, strace=[
        "strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={SYSCALLS[case.syscall]}",
        "-e", f"inject={SYSCALLS[case.syscall]}:error={case.errno}:when={n}"])
    injected = trace.read_text().count("(INJECTED)")
    if case.required:
        assert injected, f"{case}: the fault was never injected (when={n})"
    fault_rc, fault_err = rc, err  # its message is checked last: convergence tells more
    faulted_runs = {job_id for job_id, _, _ in _ledger(log)}

    expected = list(OLD_IDS)
    if case.command == "enqueue":
        expected.append("e1")
        if fault_rc != 0:  # what a client does after an error: enqueue again (idempotent)
            rc2, err2, _ = _jobspool(root, log, ENQUEUE)
            assert rc2 == 0, f"{case}: the retried enqueue failed: {_head(err2)}"

    rc, err, _ = _jobspool(root, log, ("recover",))
    assert rc == 0, f"{case}: recover after the fault failed: {_head(err)}"
    rc, err, drain_pid = _jobspool(root, log, DRAIN)
    assert rc == 0, f"{case}: the second run failed: {_head(err)}"

    _assert_converged(case, root, log, expected, faulted_runs, drain_pid)
    _assert_short_message(case, fault_rc, fault_err)


def _assert_converged(case: Case, root: Path, log: Path, expected: list[str],
                      faulted_runs: set[str], drain_pid: int) -> None:
    rc, out, _ = _fsck(root)
    assert rc == 0 and out["ok"] and out["problems"] == [], f"{case}: fsck: {out}"
    assert tmp_leftovers(root) == [], f"{case}: stray files in tmp/: {tmp_leftovers(root)}"

    where = job_files(root)
    for job_id, states in where.items():
        assert len(states) == 1, f"{case}: job {job_id} is in {states}"
    for state in STATE_DIRS:
        for name in (root / state).iterdir():
            raw = read_raw(root, state, name.stem)
            assert (raw.get("id"), raw.get("state")) == (name.stem, state), (
                f"{case}: {state}/{name.name} holds {raw.get('id')!r} in {raw.get('state')!r}")
    lost = sorted(j for j in expected if where.get(j) != ["completed"])
    assert not lost, f"{case}: not completed: {[(j, where.get(j)) for j in lost]}"

    runs = _ledger(log)
    tokens = [t for _, t, _ in runs]
    assert len(tokens) == len(set(tokens)), f"{case}: a token was handed to two runs: {runs}"
    by_job: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for job_id, token, pid in runs:
        by_job[job_id].append((token, pid))
    for job_id in expected:
        mine = by_job.get(job_id, [])
        assert mine, f"{case}: job {job_id} completed without running"
        result = read_raw(root, "completed", job_id).get("result")
        assert result == {"token": mine[-1][0]}, (
            f"{case}: job {job_id}: the accepted result {result} is not its last run "
            f"{mine} (a run after an accepted completion, or an older run's result won)")
        drained = [t for t, pid in mine if pid == drain_pid]
        assert len(drained) <= 1, f"{case}: job {job_id} ran {len(drained)} times in one run"
        if case.command != "run" or job_id not in faulted_runs:
            assert len(mine) == 1, f"{case}: job {job_id} ran {len(mine)} times: {mine}"


def _fsck(root: Path) -> tuple[int, dict[str, Any], str]:
    done = run_jobspool("--json", "fsck", root=root)
    doc = orjson.loads(done.out)
    assert isinstance(doc, dict)
    return done.code, doc, done.err
