"""`WorkerPool`: N supervised worker processes over one spool (`worker --processes N`).

Like gunicorn's or Celery's prefork master, the supervisor runs no handler
itself. It starts N children (`jobspool worker` each, sharing nothing but
the spool), restarts one that dies (with backoff when they keep dying),
forwards SIGTERM/SIGINT, and replaces a child whose sync handler ran past
its time limit: Python cannot stop a thread, but it can end a process.

Each child tells the supervisor, over a pipe, which job it starts and ends
and, as it exits, its report (`poolchild`); what it prints goes to our
stdout, as an in-process worker's would. When a child dies, the jobs whose
handlers it was running are failed with a rescue counted (`Failure(rescued=
True)`), or with `TimeLimitExceeded` when the supervisor killed it for a
hung handler; the batch mates it had claimed but not started are released
uncounted. Both act under the child's own lease tokens, so they are fenced:
a lease that already moved on is left alone.

A child exits on its own after a hung sync handler: it fails that job
(`TimeLimitExceeded`), stops claiming, lets its other handlers finish within
the grace period and exits; the supervisor starts a fresh one at once. A
child that does not exit within the grace period (or whose handler blocks
the interpreter itself) is killed (SIGKILL).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from jobspool.errors import InvalidJob, JobspoolError, LeaseLost, TimeLimitExceeded
from jobspool.errors import PoolFailed as PoolFailed
from jobspool.queue.config import kind_backoff
from jobspool.queue.interrupts import stop_signals
from jobspool.queue.job import Job, Lease, clip_error, validate_int, validate_seconds
from jobspool.queue.machine import Failure

# The child's side (what a child tells its supervisor) lives in poolchild.
from jobspool.queue.poolchild import POOL_FD_ENV, POOL_OWNER_ENV, POOL_PARENT_ENV
from jobspool.queue.poolchild import attach_child as attach_child
from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.policy import Policy
    from jobspool.queue.spool import Spool

log = logging.getLogger("jobspool.queue.pool")

# A child that lived less than this long counts towards the restart backoff.
_STABLE_SECONDS = 10.0
_MAX_BACKOFF = 10.0
MAX_PROCESSES = 1024
# How long past a hung handler's time limit the child gets to exit on its own.
_KILL_MARGIN = 2.0
# After --grace, how long a stopping child gets to give its leases back and exit.
_STOP_MARGIN = 10.0
# Children dying this many times in a row within _BOOT_SECONDS of starting: give up (as
# gunicorn does when workers cannot boot) rather than restart forever.
_MAX_BOOT_FAILURES = 5
_BOOT_SECONDS = 5.0
_REFUSALS = (1, 2)  # a command's exit codes for bad input and a refused operation


@dataclass
class _Child:
    slot: int
    generation: int
    owner: str
    proc: subprocess.Popen[bytes]
    fd: int
    started: float
    buf: bytes = b""
    running: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    hung: dict[str, tuple[int, float, float]] = field(default_factory=dict)  # as `running`
    hung_at: float | None = None
    killed_for: str | None = None  # job id whose hung handler made us kill this child
    stop_killed: bool = False  # killed for outliving its grace on shutdown
    served: bool = False  # it started a job: it booted, so its death is no boot failure
    booted: bool = False  # it said its app and spool are ready (poolchild.py): no boot failure
    report: bytes = b""  # its counts as it last sent them (after each settle, and at exit)


@dataclass(frozen=True)
class PoolReport:
    """What a pool run did: the children's reports summed, and the supervisor's own work.
    `children["unreleased"]` counts leases children could not give back at their stop,
    `children["unsettled_deaths"]` dead children whose leases could not be settled."""

    processes: int
    started: int
    restarts: int
    killed_hung: int
    rescued: int
    released: int
    children: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"processes": self.processes, "started": self.started,
                "restarts": self.restarts, "killed_hung": self.killed_hung,
                "rescued": self.rescued, "released_after_death": self.released,
                **self.children}


def child_command(root: str | Path, app: str, options: Sequence[str] = ()) -> list[str]:
    """The command line of one child: `python -m jobspool --root ROOT worker --app APP ...`.

    Its report reaches the supervisor over the pool's pipe; its stdout is the
    supervisor's, so it prints no report there (and its errors, without
    `--json`, are one line on stderr).
    """
    from jobspool.pg import is_url

    # A database URL goes by the environment (`WorkerPool` sets JOBSPOOL_ROOT): on the
    # command line its password was in `ps` for every local user, for every child.
    where = [] if is_url(str(root)) else ["--root", str(root)]
    return [sys.executable, "-m", "jobspool", *where, "worker", "--app", app, *options]


class WorkerPool:
    """Supervise `processes` children running `command` (see `child_command`) over `spool`.

    `policies` are the app's (`App.policies`): the jobs of a child that died are
    failed under their kind's attempts, backoff and `retry_on`, as the child
    itself would have failed them.
    """

    def __init__(self, spool: Spool, command: Sequence[str], processes: int, *,
                 grace_seconds: float = 30.0, env: dict[str, str] | None = None,
                 handle_signals: bool = True,
                 policies: Mapping[str, Policy] | None = None,
                 ignore_signals_after_stop: bool = False) -> None:
        self.spool = spool
        # For a process that exits once the pool stopped (the CLI): a stop signal repeated
        # after the stop is ignored, not handed to the handlers from before the pool,
        # which turned an exit 0 into "killed by SIGTERM" (or "interrupted", exit 143).
        self.ignore_signals_after_stop = ignore_signals_after_stop
        self.command = list(command)
        self.processes = validate_int("processes", processes, minimum=1)
        if self.processes > MAX_PROCESSES:
            raise InvalidJob(f"processes must be at most {MAX_PROCESSES}, got {processes} "
                             "(one Python process each; a pool that large is a typo)",
                             field="processes")
        self.grace_seconds = validate_seconds("grace_seconds", grace_seconds)
        self.env = dict(os.environ if env is None else env)
        self.handle_signals = handle_signals
        self.policies = dict(policies or {})
        self.children: dict[int, _Child] = {}
        self._restart_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._generation = 0
        self._signals = 0
        self._last_signal = "stop"  # the name of the last signal received, for the log
        self._stop_forwarded = 0
        self._stop_deadline: float | None = None  # children still up past it are killed
        self._sel = selectors.DefaultSelector()
        self._totals: dict[str, int] = {}
        self._started = self._restarts = self._killed = 0
        self._boot_failures = 0
        self._gave_up: str | None = None
        # A dead child's leases are settled by a thread of their own: the spool's lock may be
        # held by another child frozen by a handler that never lets go of the interpreter
        # (C code holding the GIL), and only this loop, free to go on, can kill that child.
        self._settles: queue.SimpleQueue[tuple[_Child, int, float] | None] = \
            queue.SimpleQueue()
        self._counts_lock = threading.Lock()

    # ------------------------------------------------------------ public

    def stop(self) -> None:
        """Like a signal: the first stops the children gracefully, the second at once."""
        self._signals += 1

    def run(self) -> PoolReport:
        """Run until a signal (or `stop()`) and every child has exited; return the report."""
        previous = self._install_signals()
        settler = threading.Thread(target=self._settle_loop, name="jobspool-pool-settle",
                                   daemon=True)
        settler.start()
        try:
            for slot in range(self.processes):
                if self._signals:
                    break  # stopping: no more children (a SIGTERM amid 200 spawns started all)
                self._spawn(slot)
            while self.children or (not self._signals and self._restart_at):
                self._step()
        finally:
            for child in list(self.children.values()):
                with contextlib.suppress(OSError):
                    child.proc.kill()
                self._reap(child)
            self._settles.put(None)
            stop_retrying = getattr(self.spool, "stop_retrying", None)
            if self._signals and stop_retrying is not None:
                # Stopping: a dead child's leases are settled now or left to expire (exit
                # 2 says so), not retried through an outage for the store's whole reconnect
                # budget (30 s past --grace), as a single worker does on its stop.
                stop_retrying()
            settler.join()  # every child is dead: no lock is held by a frozen one any more
            if self._signals and stop_retrying is not None:
                stop_retrying(False)
            self._restore_signals(previous)
            self._sel.close()
        if self._gave_up is not None:
            raise PoolFailed(self._gave_up)
        totals = dict(self._totals)
        return PoolReport(processes=self.processes, started=self._started,
                          restarts=self._restarts, killed_hung=self._killed,
                          rescued=totals.pop("rescued", 0),
                          released=totals.pop("released_after_death", 0), children=totals)

    # ------------------------------------------------------------ the loop

    def _step(self) -> None:
        for key, _ in self._sel.select(timeout=0.1):
            self._read(key.data)
        now = time.monotonic()
        if self._signals > self._stop_forwarded:
            self._forward()
        for child in list(self.children.values()):
            if child.proc.poll() is not None:
                self._reap(child)
                continue
            self._check_hung(child, now)
            if self._stop_deadline is not None and now > self._stop_deadline \
                    and not child.stop_killed:
                log.warning("pool: worker process %d (slot %d) is still running %s; killing "
                            "it", child.proc.pid, child.slot,
                            "past --grace" if self._signals == 1 else
                            "after the second signal")
                child.stop_killed = True
                with contextlib.suppress(OSError):
                    child.proc.kill()
        if not self._signals:
            for slot, at in list(self._restart_at.items()):
                if now >= at:
                    del self._restart_at[slot]
                    self._spawn(slot)
                    # Counted once spawned: a restart still pending when the pool stopped
                    # was counted too, and the summary said 22 restarts of 22 started.
                    self._restarts += 1

    def _forward(self) -> None:
        """Forward one SIGTERM per signal we got: children stop gracefully, then at once."""
        new = min(2, self._signals) - min(2, self._stop_forwarded)
        self._stop_forwarded = self._signals
        # A child that outlives its grace (a handler that ignores SIGTERM, a thread the
        # interpreter waits for) held the pool up for ever: past the grace and a margin
        # (a margin alone after a second signal), it is killed; its leases are settled
        # as any dead child's.
        grace = self.grace_seconds if self._signals == 1 else 0.0
        # Only ever sooner: each later signal pushed the kill back (a supervisor signalled
        # every few seconds kept a child that ignores SIGTERM up for as long).
        deadline = time.monotonic() + grace + _STOP_MARGIN
        if self._stop_deadline is None or deadline < self._stop_deadline:
            self._stop_deadline = deadline
        self._restart_at.clear()
        log.warning("pool: stopping %d worker process(es) on %s%s", len(self.children),
                    self._last_signal, "" if self._signals == 1 else " now (second signal)")
        for i in range(new):
            if i:
                # Two signals pending at once merge into one: let the first be delivered.
                time.sleep(0.05)
            for child in self.children.values():
                with contextlib.suppress(OSError):
                    child.proc.send_signal(signal.SIGTERM)

    def _check_hung(self, child: _Child, now: float) -> None:
        overdue = None
        for job_id, (_, started, timeout) in child.running.items():
            if timeout > 0 and now > started + timeout + max(self.grace_seconds, 1.0) + \
                    _KILL_MARGIN:
                overdue = job_id  # the child could not even fail it: its loop is stuck
        if child.hung_at is not None and now > child.hung_at + self.grace_seconds + _KILL_MARGIN:
            overdue = overdue or next(iter(child.hung), None) or "?"
        if overdue is not None and child.killed_for is None:
            child.killed_for = overdue
            self._killed += 1
            log.warning("pool: killing worker process %d (slot %d): job %s ran past its time "
                        "limit and the process did not exit", child.proc.pid, child.slot,
                        overdue)
            with contextlib.suppress(OSError):
                child.proc.kill()

    # ------------------------------------------------------------ children

    def _spawn(self, slot: int) -> None:
        self._generation += 1
        owner = f"{socket.gethostname()}:pool{os.getpid()}.{slot}.{self._generation}"
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        env = dict(self.env)
        env.update({POOL_FD_ENV: str(wfd), POOL_OWNER_ENV: owner,
                    POOL_PARENT_ENV: str(os.getpid())})
        url = getattr(self.spool, "url", None)
        if url:
            env["JOBSPOOL_ROOT"] = str(url)  # see `child_command`
        try:
            # A session of its own: a terminal's Ctrl-C reaches the supervisor only, which
            # forwards it once; the child would otherwise count it twice.
            # Its stdout is ours: what handlers print is shown as an in-process worker's
            # would be (a pipe read only at exit would fill and freeze the child).
            proc = subprocess.Popen(self.command, env=env, pass_fds=(wfd,),
                                    start_new_session=True)
        finally:
            os.close(wfd)
        child = _Child(slot=slot, generation=self._generation, owner=owner, proc=proc, fd=rfd,
                       started=time.monotonic())
        self.children[slot] = child
        self._sel.register(rfd, selectors.EVENT_READ, child)
        self._started += 1
        log.info("pool: started worker process %d (slot %d)", proc.pid, slot)

    def _read(self, child: _Child) -> bool:
        """Read what the child wrote; False at end of file (it exited)."""
        while True:
            try:
                chunk = os.read(child.fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            child.buf += chunk
            *lines, child.buf = child.buf.split(b"\n")
            for line in lines:
                if line.startswith((b"R ", b"P ")):  # its counts so far, one JSON line
                    child.report = line[2:]  # summed when it exits, however it exits
                else:
                    self._message(child, line.decode(errors="replace").split())

    def _message(self, child: _Child, parts: list[str]) -> None:
        if len(parts) < 3 or not parts[2].isdigit():
            return
        what, job_id, token = parts[0], parts[1], int(parts[2])
        if what == "B":
            child.booted = True
        elif what == "S":
            timeout = float(parts[3]) if len(parts) > 3 else 0.0
            child.running[job_id] = (token, time.monotonic(), timeout)
            child.served = True
        elif what == "E":
            child.running.pop(job_id, None)
        elif what == "H":
            # The child fails it (TimeLimitExceeded) itself, unless it dies first.
            child.hung[job_id] = child.running.pop(job_id, (token, 0.0, 0.0))
            if child.hung_at is None:
                child.hung_at = time.monotonic()

    def _reap(self, child: _Child) -> None:
        deadline = time.monotonic() + 1.0
        while self._read(child) and time.monotonic() < deadline:
            time.sleep(0.01)  # the rest of what it wrote, up to end of file
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(child.fd)
        with contextlib.suppress(OSError):
            os.close(child.fd)
        code = child.proc.wait()
        self.children.pop(child.slot, None)
        if code != 0:
            # Killed (a hung handler, outliving --grace) or crashed, it left its live metrics
            # snapshot behind: health called the pool's host `worker_stale` a minute later,
            # until another worker happened to start there.
            from jobspool.metrics import remove_worker_report

            with contextlib.suppress(OSError, AttributeError, TypeError):
                remove_worker_report(self.spool, child.owner)
        # A child killed (or crashed) never sent its final report: its last counts stand in,
        # else a summary left out everything a replaced child had done.
        self._add_report(child.report)
        self._settles.put((child, code, time.monotonic()))
        planned = child.hung_at is not None or child.killed_for is not None
        if self._signals:
            return
        lived = time.monotonic() - child.started
        # A child that started a job booted: dying in it is that job's doing (a rescue,
        # bounded by its attempts), not a reason to give up on the whole pool. Booted but
        # exiting 1 or 2 before its first job is a refusal of its own (a projection endpoint
        # that would lose commits, credentials refused): restarted, it refused for ever.
        # Booted and killed by a signal (an operator's SIGKILL of an idle child) is neither.
        if not planned and code != 0 and lived < _BOOT_SECONDS and not child.served \
                and (not child.booted or code in _REFUSALS):
            self._boot_failures += 1
            if self._boot_failures >= _MAX_BOOT_FAILURES:
                self._gave_up = (f"worker processes died {self._boot_failures} times in a row "
                                 f"right after starting (last: {_describe(code)}); see their "
                                 "log lines above")
                self._signals = max(self._signals, 1)  # stop the others too
                return
        else:
            self._boot_failures = 0
        if planned or lived >= _STABLE_SECONDS:
            self._failures[child.slot] = 0
            delay = 0.0
        else:
            n = self._failures.get(child.slot, 0) + 1
            self._failures[child.slot] = n
            delay = min(_MAX_BACKOFF, 0.1 * 2 ** (n - 1))
        why = ("replaced after a hung handler" if planned else
               f"exited with {_describe(code)}")
        log.warning("pool: worker process %d (slot %d) %s; restarting in %.1f s",
                    child.proc.pid, child.slot, why, delay)
        self._restart_at[child.slot] = time.monotonic() + delay

    def _add_report(self, out: bytes) -> None:
        """Add a child's last counts (its final report, or the last it sent) to the totals."""
        try:
            doc = orjson.loads(out)
        except orjson.JSONDecodeError:
            return
        if not isinstance(doc, dict):
            return
        for key in ("claimed", "completed", "retried", "dead_lettered", "lease_lost",
                    "released", "interrupted", "projected_rows", "timed_out", "deferred",
                    "unreleased"):
            value = doc.get(key)
            if isinstance(value, int):
                self._count(key, value)

    def _settle_loop(self) -> None:
        while (item := self._settles.get()) is not None:
            try:
                self._attribute(*item)
            except Exception as exc:  # never let one dead child stop the settling of others
                log.warning("pool: could not settle the jobs of a dead worker process: %s: %s",
                            type(exc).__name__, exc)

    def _attribute(self, child: _Child, code: int, died_at: float) -> None:
        """A dead child's leases: the jobs it was running fail (a rescue, or the time limit),
        the ones it never started go back uncounted. Runs in the settle thread."""
        try:
            held = [j for j in self.spool.jobs(state=JobState.LEASED)
                    if j.lease is not None and j.lease.owner == child.owner]
        except (OSError, JobspoolError) as exc:
            log.warning("pool: could not list the leases of a dead worker process: %s", exc)
            # Its leases stay held until they expire: the pool's exit says so (exit 2).
            self._count("unsettled_deaths")
            return
        for job in held:
            assert job.lease is not None
            lease = Lease(job_id=job.id, token=job.lease.token, owner=job.lease.owner,
                          expires_at=job.lease.expires_at, job=job)
            running = child.running.get(job.id)
            hung = child.hung.get(job.id)
            if hung is not None and hung[0] == job.lease.token:
                running = hung  # past its limit, and the child died before failing it
            elif running is None and self._died_running(job):
                # Its handler had returned, its writes not yet merged: a merge that kills
                # the child is charged to the jobs in it (else it loops uncounted).
                running = (job.lease.token, died_at, 0.0)
            try:
                if running is not None and running[0] == job.lease.token:
                    # Killed for a hung handler: every run then past its limit is timed out
                    # (several can hang in one child), the others are charged a rescue.
                    if running is hung or child.killed_for == job.id or (
                            child.killed_for is not None and running[2] > 0
                            and died_at > running[1] + running[2]):
                        over = TimeLimitExceeded(job.id, job.kind, running[2],
                                                 "its worker process was killed")
                        policy = self.policies.get(job.kind)
                        # Named as a handler's own exception is: "TimeLimitExceeded: ...".
                        settled = self.spool.fail(
                            lease, self._failure(job.kind, clip_error(over)),
                            retryable=policy is None or policy.retries(over))
                        self._count("timed_out")
                    else:
                        settled = self.spool.fail(lease, self._failure(
                            job.kind, f"worker process died ({_describe(code)}) while "
                                      "running this job", rescued=True))
                        self._count("rescued")
                    self._count("dead_lettered" if settled.state is JobState.DEAD_LETTER
                                else "retried")
                else:
                    self.spool.release(lease)
                    self._count("released_after_death")
            except LeaseLost:
                continue  # it moved on (expired and claimed, canceled): fencing says hands off
            except (OSError, JobspoolError) as exc:
                log.warning("pool: could not settle job %s of a dead worker process: %s",
                            job.id, exc)

    def _died_running(self, job: Job) -> bool:
        """The child's own liveness mark (file spool) says this lease's handler started and
        had not settled; a store without marks says nothing."""
        died_running = getattr(self.spool, "died_running", None)
        try:
            return bool(died_running(job)) if died_running is not None else False
        except OSError:
            return False

    def _count(self, key: str, n: int = 1) -> None:
        """Add to the report: the children's counts, and the settles of the supervisor's own."""
        with self._counts_lock:
            self._totals[key] = self._totals.get(key, 0) + n

    def _failure(self, kind: str, error: str, *, rescued: bool = False) -> Failure:
        """A dead child's run as the spool records it, under its kind's policy."""
        p = self.policies.get(kind)
        # The same backoff a Worker derives from the policy.
        backoff = None if p is None else kind_backoff(p, self.spool.retry_base_seconds,
                                                      self.spool.retry_max_seconds)
        return Failure(error=error, policy=backoff, rescued=rescued,
                       max_attempts=None if p is None else p.max_attempts)

    # ------------------------------------------------------------ signals

    def _install_signals(self) -> dict[int, Any]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}

        def on_signal(signum: int, frame: object) -> None:
            self._signals += 1
            self._last_signal = signal.Signals(signum).name

        for sig in stop_signals():
            previous[sig] = signal.signal(sig, on_signal)
        return previous

    def _restore_signals(self, previous: dict[int, Any]) -> None:
        ignore = self.ignore_signals_after_stop and self._signals > 0
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if ignore else handler)


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"
