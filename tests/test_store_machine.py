"""A real-clock hypothesis RuleBasedStateMachine run against each store (file and PostgreSQL).

tests/test_state_machine.py drives the file spool with a FakeClock and checks its directories;
the PostgreSQL store reads the database's clock, which no test can move. This smaller machine
needs no clock: leases are 30 s (never expiring within an example) except those taken by
`claim_and_stall`, which sleeps past its 0.2 s lease before returning; delays and backoffs are
either 0 (due at once) or an hour or more (never due within an example). The model is written
from DESIGN §3–§4 and §9; after every step the store's counts, states, attempts and lease
tokens must equal it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from jobspool import JobState, Lease, Reservation, Spool
from jobspool.errors import InvalidTransition, JobspoolError, LeaseLost
from tests.helpers_spool import STATE_DIRS, stat_counts
from tests.pgserver import PgServer, drop_schema, new_schema
from tests.spools import make_spool
from tests.store_params import sleep_past

LEASE = 30.0
BASE, CAP = 3600.0, 7200.0
IDS = ["j0", "j1", "j2", "j3"]
CANCELABLE = {"prepared", "ready", "retryable", "leased"}
OPTIONS = {"lease_seconds": LEASE, "retry_base_seconds": BASE, "retry_max_seconds": CAP,
           "max_attempts": 3}

Opener = Callable[[], tuple[Spool, Callable[[], None]]]


@dataclass
class M:
    """The model of one job."""

    kind: str
    priority: int
    max_attempts: int
    state: str
    run_at: float
    attempts: int = 0
    token: int | None = None
    expired: bool = False  # a stalled lease: known to be past its expiry
    reservations: set[str] = field(default_factory=set)


class StoreMachine(RuleBasedStateMachine):
    opener: Opener  # set per store by the tests below

    def __init__(self) -> None:
        super().__init__()
        self.spool, self._cleanup = self.opener()
        self.model: dict[str, M] = {}
        self.leases: list[Lease] = []
        self.reservations: list[Reservation] = []
        self.last_token = 0

    def teardown(self) -> None:
        self._cleanup()

    # ------------------------------------------------------------ helpers

    def _valid(self, lease: Lease) -> bool:
        m = self.model[lease.job_id]
        return m.state == "leased" and m.token == lease.token and not m.expired

    def _lease(self, i: int) -> Lease:
        """Mostly one of the newest leases (likely still current), sometimes any older one."""
        return self.leases[-1 - i % len(self.leases)] if i < 4 else self.leases[i % len(self.leases)]

    def _due(self, kinds: tuple[str, ...] | None) -> list[tuple[tuple[int, float, str], str]]:
        now = time.time()
        due = []
        for job_id, m in self.model.items():
            if kinds is not None and m.kind not in kinds:
                continue
            if (m.state == "ready" or (m.state == "retryable" and m.run_at <= now)
                    or (m.state == "leased" and m.expired)):
                due.append(((m.priority, m.run_at, job_id), job_id))
        return sorted(due)

    def _took(self, leases: list[Lease], seconds: float) -> None:
        tokens = [x.token for x in leases]
        # Every token of this claim is above every earlier one (their order within one batch
        # is test_store_contract's concern).
        assert len(set(tokens)) == len(tokens) and min(tokens, default=self.last_token + 1) > \
            self.last_token, f"fencing tokens {tokens} after {self.last_token}"
        self.last_token = max(tokens, default=self.last_token)
        for lease in leases:
            m = self.model[lease.job_id]
            m.state, m.attempts, m.token, m.expired = "leased", m.attempts + 1, lease.token, False
            assert lease.job.attempts == m.attempts
            assert lease.expires_at == pytest.approx(time.time() + seconds, abs=5.0)
            self.leases.append(lease)

    def _claim(self, limit: int, kinds: tuple[str, ...] | None, seconds: float) -> list[Lease]:
        due = self._due(kinds)
        ready = [j for _, j in due if not (self.model[j].state == "leased"
                                           and self.model[j].attempts >= self.model[j].max_attempts)]
        exhausted = [j for _, j in due if j not in ready]
        ambiguous = any(self.model[j].state == "leased" for _, j in due)
        leases = self.spool.claim(kinds=kinds, limit=limit, lease_seconds=seconds)
        got = [x.job_id for x in leases]
        if ambiguous:
            # Where an expired lease sorts is the store's choice (its expiry or its run_at);
            # which jobs and how many are not.
            assert set(got) <= set(ready) and len(got) == min(limit, len(ready)), (got, ready)
        else:
            assert got == ready[:limit], f"claim(limit={limit}, kinds={kinds}) took {got}"
        self._took(leases, seconds)
        for job_id in exhausted:
            # Out of attempts with its lease expired: dead-lettered (now, or by a later sweep),
            # never run again.
            job = self.spool.get(job_id)
            assert job.state in (JobState.LEASED, JobState.DEAD_LETTER), job
            m = self.model[job_id]
            if job.state is JobState.DEAD_LETTER:
                m.state, m.token, m.expired = "dead_letter", None, False
        return leases

    # ------------------------------------------------------------ rules

    @rule(job_id=st.sampled_from([*IDS, None]), kind=st.sampled_from(["a", "b"]),
          far=st.sampled_from([False, False, False, True]), priority=st.integers(-1, 1),
          max_attempts=st.integers(1, 3))
    def enqueue(self, job_id: str | None, kind: str, far: bool, priority: int,
                max_attempts: int) -> None:
        job = self.spool.enqueue(kind, {"n": 1}, job_id=job_id, delay=3600.0 if far else 0.0,
                                 priority=priority, max_attempts=max_attempts)
        old = self.model.get(job.id)
        if old is not None and old.state != "canceled":
            assert (str(job.state), job.attempts) == (old.state, old.attempts)
            return
        assert str(job.state) == ("retryable" if far else "ready") and job.attempts == 0
        self.model[job.id] = M(kind=job.kind, priority=priority, max_attempts=max_attempts,
                               state=str(job.state), run_at=job.run_at)

    @rule(limit=st.integers(1, 4),
          kinds=st.sampled_from([None, None, ("a",), ("b",), ("a", "b")]))
    def claim(self, limit: int, kinds: tuple[str, ...] | None) -> None:
        self._claim(limit, kinds, LEASE)

    @precondition(lambda self: any(m.state == "ready" for m in self.model.values())
                  and not any(m.expired for m in self.model.values()))
    @rule()
    def claim_and_stall(self) -> None:
        """A worker that claims and then stalls past its lease (GC, SIGSTOP)."""
        for lease in self._claim(1, None, 0.2):
            sleep_past(lease.expires_at)
            self.model[lease.job_id].expired = True

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 20))
    def heartbeat(self, i: int) -> None:
        lease = self._lease(i)
        if not self._valid(lease):
            with pytest.raises(LeaseLost):
                self.spool.heartbeat(lease)
            return
        renewed = self.spool.heartbeat(lease)
        assert renewed.token == lease.token and renewed.expires_at >= lease.expires_at

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 20))
    def complete(self, i: int) -> None:
        lease = self._lease(i)
        if not self._valid(lease):
            with pytest.raises(LeaseLost):
                self.spool.complete(lease, "late")
            return
        assert self.spool.complete(lease, "r").state is JobState.COMPLETED
        m = self.model[lease.job_id]
        m.state, m.token = "completed", None

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 20), retryable=st.booleans(), now=st.booleans())
    def fail(self, i: int, retryable: bool, now: bool) -> None:
        lease = self._lease(i)
        delay = 0.0 if now else None
        if not self._valid(lease):
            with pytest.raises(LeaseLost):
                self.spool.fail(lease, "e", retryable=retryable, delay=delay)
            return
        at = time.time()
        job = self.spool.fail(lease, "e", retryable=retryable, delay=delay)
        m = self.model[lease.job_id]
        m.token = None
        if not retryable or m.attempts >= m.max_attempts:
            assert job.state is JobState.DEAD_LETTER
            m.state = "dead_letter"
            return
        assert job.state is JobState.RETRYABLE
        if now:
            assert job.run_at <= time.time()
        else:
            nominal = min(CAP, BASE * 2 ** (m.attempts - 1))
            assert 0.5 * nominal - 5 <= job.run_at - at <= min(1.5 * nominal, CAP) + 5
        m.state, m.run_at = "retryable", job.run_at

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 20))
    def release(self, i: int) -> None:
        lease = self._lease(i)
        if not self._valid(lease):
            with pytest.raises(LeaseLost):
                self.spool.release(lease)
            return
        job = self.spool.release(lease)
        m = self.model[lease.job_id]
        assert job.state is JobState.READY
        m.state, m.token, m.attempts, m.run_at = "ready", None, m.attempts - 1, job.run_at

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 20))
    def cancel(self, i: int) -> None:
        job_id = sorted(self.model)[i % len(self.model)]
        m = self.model[job_id]
        if m.state not in CANCELABLE:
            with pytest.raises(InvalidTransition):
                self.spool.cancel(job_id)
            return
        assert self.spool.cancel(job_id).state is JobState.CANCELED
        m.state, m.token, m.expired = "canceled", None, False
        m.reservations.clear()

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 20))
    def requeue(self, i: int) -> None:
        job_id = sorted(self.model)[i % len(self.model)]
        m = self.model[job_id]
        if m.state not in ("dead_letter", "canceled", "completed"):  # finished: runs again
            with pytest.raises(InvalidTransition):
                self.spool.requeue(job_id)
            return
        job = self.spool.requeue(job_id)
        assert job.state is JobState.READY
        if m.state == "dead_letter":
            assert job.attempts == 0  # a fresh set of attempts
        m.state, m.attempts, m.run_at = "ready", job.attempts, job.run_at

    @rule(job_id=st.sampled_from([*IDS, None]), kind=st.sampled_from(["a", "b"]))
    def prepare(self, job_id: str | None, kind: str) -> None:
        r = self.spool.prepare(kind, {"n": 2}, job_id=job_id)
        self.reservations.append(r)
        old = self.model.get(r.job_id)
        if old is None or old.state == "canceled":
            assert r.job.state is JobState.PREPARED and r.job.attempts == 0
            self.model[r.job_id] = M(kind=r.job.kind, priority=0, max_attempts=r.job.max_attempts,
                                     state="prepared", run_at=r.job.run_at,
                                     reservations={r.reservation_id})
        elif old.state == "prepared":
            assert r.job.state is JobState.PREPARED
            old.reservations.add(r.reservation_id)
        else:
            assert str(r.job.state) == old.state  # idempotent: returned unchanged

    @precondition(lambda self: self.reservations)
    @rule(i=st.integers(0, 20))
    def commit(self, i: int) -> None:
        r = self.reservations[i % len(self.reservations)]
        m = self.model[r.job_id]
        if m.state == "canceled" or (m.state == "prepared"
                                     and r.reservation_id not in m.reservations):
            with pytest.raises(InvalidTransition):
                self.spool.commit(r)
            return
        job = self.spool.commit(r)
        if m.state == "prepared":
            assert job.state is JobState.READY
            m.state, m.run_at = "ready", job.run_at
            m.reservations.clear()
        else:
            assert str(job.state) == m.state  # idempotent once the job left prepared

    @precondition(lambda self: self.reservations)
    @rule(i=st.integers(0, 20))
    def abort(self, i: int) -> None:
        r = self.reservations[i % len(self.reservations)]
        m = self.model[r.job_id]
        if m.state != "prepared" or r.reservation_id not in m.reservations:
            with contextlib.suppress(JobspoolError):  # not this producer's to abort any more
                self.spool.abort(r)
            return
        self.spool.abort(r)
        m.reservations.discard(r.reservation_id)
        if not m.reservations:
            m.state = "canceled"

    # ------------------------------------------------------------ invariants

    def _follow_sweeps(self) -> None:
        """An expired lease may be swept at any time (DESIGN §6 step 3, issue 16's sweep by
        workers): back to retryable, due at once, attempts kept; or to dead_letter when out
        of attempts (or past the poison-pill cap). Follow the store where it did so."""
        for job_id, m in self.model.items():
            if not (m.state == "leased" and m.expired):
                continue
            job = self.spool.get(job_id)
            if job.state is JobState.LEASED:
                assert job.lease is not None and job.lease.token == m.token, job
                continue
            assert job.lease is None and job.attempts == m.attempts, job
            if job.state is JobState.RETRYABLE:
                assert job.run_at <= time.time() + 1.0, job
                m.state, m.run_at = "retryable", job.run_at
            else:
                assert job.state is JobState.DEAD_LETTER, job
                assert m.attempts >= m.max_attempts or job.rescues > 10, job
                m.state = "dead_letter"
            m.token, m.expired = None, False

    @invariant()
    def the_store_equals_the_model(self) -> None:
        self._follow_sweeps()
        expected = dict.fromkeys(STATE_DIRS, 0)
        for m in self.model.values():
            expected[m.state] += 1
        assert stat_counts(self.spool.stats()) == expected
        listed = {j.id: j for j in self.spool.jobs()}
        assert set(listed) == set(self.model)
        for job_id, m in self.model.items():
            job = self.spool.get(job_id)
            assert job == listed[job_id]
            assert (str(job.state), job.attempts) == (m.state, m.attempts), job_id
            assert (job.lease.token if job.lease else None) == m.token, job_id


MACHINE_SETTINGS = settings(max_examples=25, stateful_step_count=40, deadline=None)


def _run(opener: Opener) -> None:
    machine = type("Machine", (StoreMachine,), {"opener": staticmethod(opener)})
    run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)


def test_the_file_store_follows_the_model_on_the_real_clock() -> None:
    def opener() -> tuple[Spool, Callable[[], None]]:
        tmp = Path(tempfile.mkdtemp(prefix="jobspool-sm-"))
        spool = make_spool(tmp / "s", **OPTIONS)

        def cleanup() -> None:
            spool.close()
            shutil.rmtree(tmp, ignore_errors=True)
        return spool, cleanup

    _run(opener)


def test_the_postgresql_store_follows_the_model_on_the_database_clock(pg_server: PgServer) -> None:
    def opener() -> tuple[Spool, Callable[[], None]]:
        schema, url = new_schema(pg_server.url)
        try:
            spool = make_spool(url, **OPTIONS)
        except BaseException:
            drop_schema(pg_server.url, schema)
            raise

        def cleanup() -> None:
            spool.close()
            drop_schema(pg_server.url, schema)
        return spool, cleanup

    _run(opener)
