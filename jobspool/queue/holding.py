"""`Holding`: what a lease holder may do to its job on the file spool (DESIGN §4):
heartbeat, check, complete, fail, release, and run a block fenced by the lease.

Every operation reads the job's file in `leased/` under the spool lock, checks
the token and the expiry (`machine.check_lease`) and only then commits; a
stale holder gets `LeaseLost` and changes nothing. The batched forms
(`heartbeat_many`, `complete_many`, `fail_many`) share one lock hold and one
flush per batch: what the worker uses. Claiming, which hands leases out, is
`Leasing` (leasing.py), built on this.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from jobspool.errors import JobspoolError, JobTooLarge, LeaseLost, WriteFailed
from jobspool.queue import machine
from jobspool.queue.job import (
    Job,
    Lease,
    evolve,
    json_snapshot,
    survivor_key,
    validate_delay,
    validate_seconds,
)
from jobspool.queue.jobsize import encode_completed
from jobspool.queue.journal import Journal
from jobspool.queue.states import ALL_STATES, JobState
from jobspool.queue.storenames import JOB_SUFFIX

log = logging.getLogger("jobspool.queue.spool")


_CANCELED = (JobState.CANCELED,)


class Holding:
    """The lease holder's operations, on a `Journal`."""

    journal: Journal

    def _leased_job(self, lease: Lease) -> Job:
        job = self.journal.read_job(JobState.LEASED, lease.job_id)
        if job is None:
            found, _ = self.journal.locate(lease.job_id)
            if found is not None and found.state is JobState.LEASED:
                # Read this time: the first read failed for a moment (an I/O error). Told
                # "lost", a worker threw a finished run's result and writes away.
                return found
            if found is not None:
                raise LeaseLost(lease.job_id, lease.token, f"job is {found.state.value}")
            where = self.journal.unreadable_file(lease.job_id)
            if where is not None:
                # "job is gone" sent the operator looking for a deleted file.
                raise LeaseLost(lease.job_id, lease.token,
                                f"its file {self.journal.root / where} cannot be read (edited "
                                "or damaged; `jobspool recover` quarantines it)")
            raise LeaseLost(lease.job_id, lease.token, "job is gone")
        # Another process moves a live lease out only to cancel it, writing `canceled/`
        # first and removing the old file after: a crash between them (or a removal that
        # failed, or an operator restoring a backup into `leased/`) left the old lease
        # readable, and its holder heartbeat and completed the job at a revision above the
        # cancel's: the cancel was undone. (An expired lease's sweep leaves an expired
        # lease: refused anyway.) One lstat; `canceled/` alone, as each costs a settle ~1 µs.
        newer = self._newer_copy(job, among=_CANCELED)
        if newer is not None:
            raise LeaseLost(lease.job_id, lease.token, f"job is {newer.state.value}")
        return job

    def _newer_copy(self, job: Job, among: Iterable[JobState] = ALL_STATES) -> Job | None:
        """The copy of `job` in another state directory (of `among`) that readers show and
        recovery keeps instead of this one (`survivor_key`: the higher revision), if any.

        An lstat per other directory finds none in the common case (7 µs per job for all
        of them, measured: 10 % of a durable claim + complete in batches of 50); only a
        copy that is there gets read.
        """
        best = job
        for state in among:
            if state is job.state or not self.journal.store.present(state.value,
                                                                   job.id + JOB_SUFFIX):
                continue
            other = self.journal.read_job(state, job.id)
            if other is not None and survivor_key(other) > survivor_key(best):
                best = other
        return None if best is job else best

    def heartbeat(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        """Extend a lease; `LeaseLost` (and no change) unless it is current and unexpired."""
        (out,), refused = self._check_leases([lease], margin=math.inf,
                                             lease_seconds=lease_seconds)
        if isinstance(out, LeaseLost):
            raise out
        if refused is not None and lease.job_id not in refused.landed:
            # Returned unextended, it passed for extended: the caller ran on, sure of a
            # lease that expired under it. (The batch form returns it unextended: the
            # worker's beat only needs to know it still holds.)
            raise refused
        return out

    def heartbeat_many(self, leases: Sequence[Lease], *, lease_seconds: float | None = None
                       ) -> list[Lease | LeaseLost]:
        """Extend many leases under one lock hold and one shared flush (the worker's beat).

        Returns per lease the extended lease, or the `LeaseLost` that refused it.
        """
        return self.check_leases(leases, margin=math.inf, lease_seconds=lease_seconds)

    def check_leases(self, leases: Sequence[Lease], *, margin: float = 0.0,
                     lease_seconds: float | None = None) -> list[Lease | LeaseLost]:
        """Which leases are still current: per lease, itself or the `LeaseLost` refusing it.

        Reads only; a lease with less than `margin` seconds left is extended
        (written) in the same lock hold, so a caller about to do a side effect
        keeps it for at least that long.
        """
        return self._check_leases(leases, margin=margin, lease_seconds=lease_seconds)[0]

    def _check_leases(self, leases: Sequence[Lease], *, margin: float,
                      lease_seconds: float | None) -> tuple[list[Lease | LeaseLost],
                                                            WriteFailed | None]:
        """`check_leases`, and the error that refused the extensions, if any."""
        refused: WriteFailed | None = None
        given = None if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        out: list[Lease | LeaseLost] = []
        with self.journal.lock.hold():
            now = self.journal.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            for lease in leases:
                try:
                    job = self._leased_job(lease)
                    machine.check_lease(job, lease, now)
                except LeaseLost as exc:
                    out.append(exc)
                    continue
                assert job.lease is not None
                if job.lease.expires_at - now >= margin:
                    out.append(lease)
                    continue
                seconds = given or lease.seconds or self.journal.lease_seconds
                new = machine.heartbeat(job, lease, now=now, lease_seconds=seconds)
                pairs.append((job, new))
                assert new.lease is not None
                out.append(Lease(job_id=lease.job_id, token=lease.token, owner=lease.owner,
                                 expires_at=new.lease.expires_at, job=new, seconds=seconds))
            try:
                self.journal.commit_changes(pairs)
            except WriteFailed as exc:
                # A lease whose extension did not land is still the current one, unextended.
                log.warning("heartbeat: %s", exc)
                refused = exc
                asked = {lease.job_id: lease for lease in leases}
                tried = {new.id for _, new in pairs if new is not None}
                out = [asked[o.job_id] if not isinstance(o, LeaseLost) and o.job_id in tried
                       and o.job_id not in exc.landed else o for o in out]
        return out, refused

    def complete(self, lease: Lease, result: Any = None) -> Job:
        """Mark a leased job completed (fenced: `LeaseLost` if the lease is not current)."""
        outcome = self.complete_many([(lease, result)])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def complete_many(self, items: Sequence[tuple[Lease, Any]]) -> list[Job | JobspoolError]:
        """Complete many leases under one lock hold and one shared flush.

        Returns, per item, the completed job or the error that refused it:
        `LeaseLost` or `InvalidJob` (a result that is not JSON) change nothing;
        `JobTooLarge` (a result that does not fit) comes with the job
        dead-lettered (DESIGN §9, sizes).
        """
        return self._settle([lease for lease, _ in items],
                            [("complete", result) for _, result in items])

    def fail(self, lease: Lease, error: object, *, retryable: bool = True,
             delay: float | None = None) -> Job:
        """Record a failed attempt: `retryable` with backoff, or `dead_letter` when permanent
        or out of attempts (fenced like `complete`)."""
        if delay is not None:
            delay = validate_delay(delay)
        outcome = self.fail_many([(lease, error, retryable, delay)])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def fail_many(self, items: Sequence[tuple[Lease, object, bool, float | None]]
                  ) -> list[Job | JobspoolError]:
        """Fail many leases under one lock hold and one shared flush (see `complete_many`)."""
        return self._settle([item[0] for item in items],
                            [("fail", (err, retry, delay)) for _, err, retry, delay in items])

    def _settle(self, leases: Sequence[Lease],
                actions: Sequence[tuple[str, Any]]) -> list[Job | JobspoolError]:
        out: list[Job | JobspoolError] = []
        with self.journal.lock.hold():
            now = self.journal.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            encoded: dict[str, bytes] = {}
            for lease, (action, arg) in zip(leases, actions, strict=True):
                try:
                    if lease.job_id in encoded:
                        # The disk still shows it leased: without this the second item
                        # would settle it again, over the first (same on PostgreSQL).
                        raise LeaseLost(lease.job_id, lease.token, "settled twice in one batch")
                    job = self._leased_job(lease)
                    new = machine.settle(job, lease, action, arg, now=now, policy=self.journal.policy,
                                         rng=self.journal.rng)
                    told: JobspoolError | None = None
                    try:
                        # Encoded here, once, so one bad result refuses only its own item.
                        new, encoded[new.id] = self._encode_settled(new, action)
                    except JobTooLarge as exc:
                        new, told = machine.result_refused(job, lease, exc, now=now,
                                                           policy=self.journal.policy)
                        new, encoded[new.id] = self.journal.fit_internal(new)
                except JobspoolError as exc:
                    out.append(exc)
                    continue
                out.append(new if told is None else told)
                pairs.append((job, new))
            settled, failed = self.journal.commit_in_parts(pairs, encoded)
            if failed is not None:
                # Settled where the new version reached the disk; the others stay leased
                # under their current lease and get this error.
                log.warning("settle: %s (%d of %d settled anyway)", failed, len(settled),
                            len(pairs))
                out = [o if not isinstance(o, Job) or o.id in settled else failed for o in out]
        self.journal.maybe_autoprune()
        return out

    def _encode_settled(self, job: Job, action: str) -> tuple[Job, bytes]:
        """The settled job as written, and its bytes."""
        if action != "complete":
            # A failure's error and traceback are cut to fit: recording it never fails.
            # The job returned is the one cut (`fail` returned the whole error, which a
            # `get` then did not show).
            return self.journal.fit_internal(job)
        job, data = encode_completed(job, max_bytes=self.journal.max_job_bytes)
        if job.result is not None and not isinstance(job.result, (str, int, float)):
            # The result as stored (and as `get` and the PostgreSQL store give it): lists
            # for tuples, the caller's own dict not kept. Checked above, so the copy holds.
            job = evolve(job, result=json_snapshot(job.result))
        return job, data

    def release(self, lease: Lease, *, delay: float = 0.0, reason: str | None = None) -> Job:
        """Give a leased job back without counting the attempt (fenced)."""
        delay = validate_delay(delay)
        with self.journal.lock.hold():
            job = self._leased_job(lease)
            new = machine.release(job, lease, now=self.journal.now(), delay=delay,
                                  error=reason)
            self.journal.commit_changes([(job, new)])
            return new

    def abandon(self, thread_ident: int) -> None:
        """A handler's thread was given up on past its time limit: end its hold of the
        spool lock inside a fenced block, now or at the block's next step (`SpoolLock.cut`).
        It kept every thread and process of the spool waiting for as long as it ran."""
        if self.journal.lock.threads.cut(thread_ident) == "cut":
            log.warning("spool %s: ended the fenced block of a handler abandoned past its "
                        "time limit: what it wrote in the block stays, nothing after",
                        self.journal.root)

    @contextmanager
    def fenced(self, lease: Lease) -> Iterator[Lease]:
        """Run a block under the spool lock, only while `lease` is current.

        Checks the lease before the block (`LeaseLost` otherwise) and extends
        it before releasing the lock, so no claim can take the job while the
        block runs. Protects side effects that must not happen after the job
        moved on; it does not make them atomic with the job's completion.
        """
        lock = self.journal.lock
        with lock.hold():
            job = self._leased_job(lease)
            machine.check_lease(job, lease, self.journal.now())
            # A handler abandoned past its time limit in here is cut off at its next step
            # (`handover.py`): what it wrote before stays written (files are not a
            # transaction), nothing after; its job is the worker's to settle.
            lock.threads.allow_cut()
            try:
                yield lease
            finally:
                lock.threads.forbid_cut()
            # Held since the check: a block that outlived the lease let nobody take the job,
            # so it is extended all the same (refusing it raised LeaseLost for a side
            # effect already done, and the job ran again, side effect and all).
            job = self._leased_job(lease)
            new = machine.heartbeat(job, lease, now=self.journal.now(),
                                    lease_seconds=lease.seconds or self.journal.lease_seconds,
                                    held=True)
            try:
                self.journal.commit_changes([(job, new)])
            except WriteFailed as exc:
                # The block is done, its side effect with it: raising here made the caller
                # (or the job's retry) do it again. The lease stands, unextended.
                log.warning("fenced block done, but its lease of job %s was not extended: "
                            "%s", lease.job_id, exc)
