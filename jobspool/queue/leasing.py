"""`Leasing`: claims, expired-lease reclaims and the claim index (DESIGN §4), on top
of `Holding` (holding.py), what a lease holder does with the lease it got."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Collection, Iterable

from jobspool.errors import FULL_DISK, WriteFailed
from jobspool.queue import claimnotes, interrupts, liveness, machine
from jobspool.queue.arguments import check_exclude, listed
from jobspool.queue.backlog import Waiting
from jobspool.queue.diskerrors import write_failed
from jobspool.queue.holding import Holding
from jobspool.queue.job import (
    Job,
    Lease,
    validate_int,
    validate_kind,
    validate_owner,
    validate_seconds,
)
from jobspool.queue.journal import Journal
from jobspool.queue.states import JobState
from jobspool.queue.store import Change
from jobspool.queue.storenames import JOB_SUFFIX

log = logging.getLogger("jobspool.queue.spool")


class Leasing(Holding):
    """Claiming and settling leased jobs, on a `Journal`; `owner` names this process in
    the leases it takes (`host:pid` unless a claim names another)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._mark: tuple[int, liveness.ProcessMark] | None = None

    # ------------------------------------------------------------ consuming

    def claim(self, *, kinds: Iterable[str] | str | None = None, limit: int = 1,
              owner: str | None = None, lease_seconds: float | None = None,
              exclude: Collection[str] = ()) -> list[Lease]:
        """Lease up to `limit` due jobs in (priority, run_at, id) order, one fsync'd batch.

        Takes jobs from `ready`, from `retryable` once `run_at <= now`, and from
        `leased` when the lease expired (the crashed-worker case: the attempt
        is counted, and a job out of attempts or rescues is dead-lettered
        instead). Each lease gets a fresh token from the spool-wide counter.
        `exclude` names jobs the caller already runs (a worker never claims
        one of its own jobs whose lease lapsed while its handler still runs:
        another worker may, that is what fencing is for).
        """
        validate_int("limit", limit, minimum=1)
        seconds = self.journal.lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        kind_set: frozenset[str] | None
        if kinds is None:
            kind_set = None
        else:
            kind_set = frozenset([kinds] if isinstance(kinds, str)
                                 else listed("kinds", kinds, "job kinds"))
            for k in kind_set:
                validate_kind(k)
        who = self.owner if owner is None else validate_owner(owner)
        excluded = check_exclude(exclude)
        with self.journal.lock.hold(), interrupts.deferred() as section:
            while True:
                try:
                    leases = self._claim_locked(kind_set, limit, who, seconds, excluded)
                    break
                except BaseException as exc:
                    # The index already forgot the candidates it handed out; a failure
                    # before the write must not hide those jobs from later claims.
                    self.journal.index.invalidate()
                    if not (isinstance(exc, WriteFailed) and exc.errno in FULL_DISK
                            and limit > 1 and not exc.landed):
                        raise
                # A batch writes all its new files before it retires the old ones: on a
                # disk with room for a few, a batch of 50 failed for ever (a worker gave
                # up after five) while one at a time drained it. Smaller, then.
                limit = max(1, limit // 4)
            if leases and section.pending():
                try:
                    section.deliver()  # now, while the leases can still be given back
                except BaseException:
                    # Ctrl-C or SIGTERM came during the claim and leaves it as an
                    # exception: nobody would hold these leases until they expired. A
                    # handler that returns (a graceful-stop flag) keeps them: given back,
                    # they were returned all the same and the jobs ran twice.
                    self._give_back(leases)
                    raise
            return leases

    def _give_back(self, leases: list[Lease]) -> None:
        now = self.journal.now()
        try:
            pairs = []
            for lease in leases:
                job = self._leased_job(lease)
                pairs.append((job, machine.release(job, lease, now=now, delay=0.0)))
            self.journal.commit_changes(pairs)
        except Exception as exc:  # they expire as any lease of a dead claimer does
            log.warning("could not give back %d leases of an interrupted claim: %s",
                        len(leases), exc)

    def _claim_locked(self, kind_set: frozenset[str] | None, limit: int, who: str,
                      seconds: float, exclude: frozenset[str]) -> list[Lease]:
        now = self.journal.now()
        self.journal.index.refresh()
        picked: list[Job] = []
        dead: list[tuple[Job | None, Job | None]] = []
        stale: list[Change] = []
        skipped: set[str] = set()  # excluded candidates: left in the index, asked past
        fresh: set[str] = set()  # expired leases of dead holders that never started them
        doubles: set[str] = set()  # ids met in two claimable directories
        # Twice at most: a copy dropped as stale (a crash between publishing a job's new
        # file and retiring the old one) leaves room for its current copy, which the
        # first pass skipped as a double; without the second pass the claim came back
        # short, even empty, and `run-until-idle` stopped with due work left.
        for _pass in range(2):
            while len(picked) < limit:
                want = limit - len(picked) + len(skipped)
                cands = [c for c in self.journal.index.candidates(now, kind_set, want)
                         if c.job_id not in skipped]
                if not cands:
                    break
                for c in cands:
                    if c.job_id in exclude:
                        skipped.add(c.job_id)
                        continue
                    if any(p.id == c.job_id for p in picked):
                        # The same id due in two directories: a crash (or a hand) left a copy.
                        # Never loop on it; settle which copy is current after the scan.
                        skipped.add(c.job_id)
                        doubles.add(c.job_id)
                        continue
                    listed = self.journal.index.listed(c.job_id)
                    job = self.journal.read_job(c.state, c.job_id)
                    self.journal.index.forget(c.state, c.job_id)
                    if job is None:
                        if self.journal.store.surely_present(c.state.value,
                                                             c.job_id + JOB_SUFFIX):
                            self.journal.index.note_unreadable(c.state, c.job_id)
                        continue
                    if not machine.is_due(job, now) or (job.priority, job.run_at) != c.order[:2] \
                            or (kind_set is not None and job.kind not in kind_set):
                        # The cache was behind (another process's replace rewrote the job
                        # with a new kind, priority or time): keep the true key and look
                        # again, in order. Taken as cached, an img worker claimed an email
                        # job and crashed on its missing handler.
                        self.journal.index.learn(job)
                        if not machine.is_due(job, now):
                            # Not due is not due for the rest of this claim: an index that
                            # handed it back again looped the claim, holding the lock.
                            skipped.add(c.job_id)
                        continue
                    # A crash between publishing a job's new file and retiring the old one, or
                    # a hand (an old backup restored into ready/), can leave a stale copy
                    # here: running it would redo or undo finished work, or take a live
                    # lease. A crash flags the spool (`suspect`); a hand's file is one this
                    # process met in a listing (`listed`), not through a writer of the
                    # spool. Checking only those keeps six lstats off most claims.
                    newer = (self._newer_copy(job)
                             if listed or self.journal.lock.suspect() else None)
                    if newer is not None:
                        log.warning("job %s: dropping stale %s copy (revision %d) behind %s "
                                    "(revision %d)", job.id, job.state.value, job.revision,
                                    newer.state.value, newer.revision, extra={"job_id": job.id})
                        stale.extend(self.journal.stale_removals(job.id, [job.state]))
                        continue
                    unstarted = machine.lease_expired(job, now) and self._unstarted(job)
                    if machine.lease_expired(job, now) and not unstarted and self._exhausted(job):
                        gone = machine.reclaim(job, now=now, policy=self.journal.policy,
                                               max_rescues=self.journal.max_rescues, rng=self.journal.rng)
                        log.warning("job %s (%s) dead-lettered on reclaim: %s", job.id, job.kind,
                                    gone.last_error, extra={"job_id": job.id, "kind": job.kind,
                                                            "state": gone.state.value})
                        dead.append((job, gone))
                        continue
                    picked.append(job)
                    if unstarted:
                        fresh.add(job.id)
            if not doubles:
                break
            picked = self._drop_stale_doubles(picked, doubles, stale)
            skipped -= doubles
            doubles = set()
        pairs: list[tuple[Job | None, Job | None]] = list(dead)
        leases: list[Lease] = []
        extra: list[Change] = []
        proc = None
        if picked:
            mark = self.process_mark()
            mark.claimed = True
            proc = mark.ident
        # Tokens come from shared memory; a new ceiling, when one is due, is flushed to
        # disk here, before any of these tokens is written into a job (fence.py).
        first = self.journal.fence.take(len(picked)) if picked else 0
        for token, job in enumerate(picked, start=first):
            new = machine.claim(job, token=token, owner=who, now=now, lease_seconds=seconds,
                                proc=proc, unstarted=job.id in fresh)
            pairs.append((job, new))
            assert new.lease is not None
            leases.append(Lease(job_id=new.id, token=token, owner=who,
                                expires_at=new.lease.expires_at, job=new, seconds=seconds))
        if pairs or stale:
            try:
                self.journal.commit_changes(pairs, extra + stale)
            except WriteFailed as exc:
                adopted = [lease for lease in leases if lease.job_id in exc.landed]
                if not adopted:
                    raise
                # Published but not confirmed durable: run them (at worst a power loss
                # returns them to their old state and they run again).
                log.warning("claim: %s; adopting the %d lease(s) that reached the disk",
                            exc, len(adopted))
                return adopted
            claimnotes.dead_lettered(len(dead))
        return leases

    def _drop_stale_doubles(self, picked: list[Job], doubles: set[str],
                            stale: list[Change]) -> list[Job]:
        """Of picked jobs that also have a copy elsewhere, keep only current ones; remove the
        stale copies and flag the spool so claims check for more until recovery runs."""
        self.journal.lock.bump(self.journal.lock.SUSPECT_SLOT)
        keep: list[Job] = []
        for job in picked:
            newer = self._newer_copy(job) if job.id in doubles else None
            if newer is None:
                keep.append(job)
                continue
            log.warning("job %s: dropping stale %s copy (revision %d) behind %s (revision %d)",
                        job.id, job.state.value, job.revision, newer.state.value,
                        newer.revision, extra={"job_id": job.id})
            stale.extend(self.journal.stale_removals(job.id, [job.state]))
            self.journal.index.learn(newer)
        return keep

    def _unstarted(self, job: Job) -> bool:
        """Whether an expired lease's holder is provably dead and never started its handler
        (see `liveness.py`): then the attempt was never made and is not counted."""
        running = self._dead_holder_running(job)
        return running is not None and job.lease is not None and job.lease.token not in running

    def reclaim_dead(self) -> int:
        """Take back now, not when they expire, the leases whose holder is provably dead
        (its liveness lock is free), as `recover` does: a job its handler was running on
        counts a rescue, one never started (or already returned) goes back uncounted. An
        idle worker calls this, so `run-until-idle` after a `kill -9` drains those jobs too
        instead of leaving them leased (to a dead process) for `lease_seconds`."""
        names = self.journal.store.names(JobState.LEASED.value)
        if not names:
            return 0
        verdicts: dict[str, tuple[str, dict[str, object] | None]] = {}
        with self.journal.lock.hold():
            now = self.journal.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            for job_id in names:
                job = self.journal.read_job(JobState.LEASED, job_id)
                if job is None or job.lease is None or job.lease.proc is None:
                    continue
                proc = job.lease.proc
                if proc not in verdicts:
                    verdicts[proc] = liveness.probe(self.journal.root, proc)
                verdict, doc = verdicts[proc]
                if verdict != liveness.Verdict.DEAD or self._newer_copy(job) is not None:
                    continue  # alive, unknown, or a crash leftover for `recover`
                pairs.append((job, machine.take_back(
                    job, now=now, running=liveness.running_tokens(doc),
                    policy=self.journal.policy, max_rescues=self.journal.max_rescues,
                    rng=self.journal.rng)))
            if pairs:
                self.journal.commit_changes(pairs)
                claimnotes.dead_lettered(sum(1 for _, new in pairs if new is not None
                                             and new.state is JobState.DEAD_LETTER))
        if pairs:
            log.warning("took back %d lease(s) of dead worker process(es): %s", len(pairs),
                        ", ".join(sorted(old.id for old, _ in pairs if old is not None)))
        return len(pairs)

    def died_running(self, job: Job) -> bool:
        """Whether the lease's holder is provably dead while its mark said this lease's
        handler had started and not settled (running, or its writes being merged)."""
        running = self._dead_holder_running(job)
        return running is not None and job.lease is not None and job.lease.token in running

    def _dead_holder_running(self, job: Job) -> set[int] | None:
        """The running tokens of a lease holder that is provably dead, else None."""
        if job.lease is None or job.lease.proc is None:
            return None
        verdict, doc = liveness.probe(self.journal.root, job.lease.proc)
        if verdict != liveness.Verdict.DEAD:
            return None
        return liveness.running_tokens(doc)

    def process_mark(self) -> liveness.ProcessMark:
        """This process's liveness mark in this spool (registered on first use; cached per
        process, so a claim does not resolve the root's real path every time)."""
        cached = self._mark
        if cached is not None and cached[0] == os.getpid():
            return cached[1]
        try:
            mark = liveness.mark_for(self.journal.root, self.journal.store.file_mode)
        except OSError as exc:
            raise write_failed(exc, self.journal.root) from None
        self._mark = (os.getpid(), mark)
        return mark

    def note_running(self, tokens: Iterable[int], *, started: bool) -> None:
        """Record that handlers for these leases started (or settled): if this process dies,
        recovery charges a rescue only to the jobs whose handlers had started."""
        try:
            self.process_mark().running(tokens, started=started)
        except (OSError, WriteFailed) as exc:  # advisory: else a death charges the whole batch
            log.debug("could not record running handlers: %s", exc)

    def _exhausted(self, job: Job) -> bool:
        if job.attempts >= job.max_attempts:
            return True
        return self.journal.max_rescues is not None and job.rescues + 1 > self.journal.max_rescues

    def preload(self) -> None:
        """Read the claimable backlog into this process's claim index now.

        A process's first claim reads the sort key of every job waiting in
        `ready/`, `retryable/` and `leased/` (about 10 µs a job: a second for
        100,000); later claims read only what changed. Call this at start-up
        to pay that cost before serving rather than inside the first claim.
        """
        with self.journal.lock.hold():
            self.journal.index.refresh()

    def next_due_at(self, kinds: Iterable[str] | None = None) -> float | None:
        """When the next not-yet-due job (retryable, or an expiring lease) becomes claimable."""
        kind_set = None if kinds is None else frozenset(kinds)
        with self.journal.lock.hold():
            self.journal.index.refresh()
            return self.journal.index.next_due_at(self.journal.now(), kind_set)

    def waiting(self) -> dict[str, Waiting]:
        """Jobs waiting to be claimed, per kind, from the claim index (no job file read); a
        file placed by hand a moment ago is seen (`look`: three directory stats)."""
        with self.journal.lock.hold():
            self.journal.index.refresh(look=True)
            return self.journal.index.waiting(self.journal.now())

    def live_tokens(self) -> list[int]:
        """Tokens of every unexpired lease (maintenance keeps tombstones newer than the least)."""
        now = self.journal.now()
        out = []
        for job_id in self.journal.store.names(JobState.LEASED.value):
            job = self.journal.read_job(JobState.LEASED, job_id)
            if job is not None and job.lease is not None and job.lease.expires_at > now:
                out.append(job.lease.token)
        return out

    def min_live_token(self) -> int:
        """The smallest token any live lease holds, or the next token when none is live:
        no run that could still write carries a smaller one."""
        return min(self.live_tokens(), default=self.journal.fence_value() + 1)
