"""A claim whose reply is lost after it committed: sent again, it adopts its own leases."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from jobspool.queue.states import JobState
from tests.spools import make_spool


def _lose_the_first_claim_reply(spool: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The claim statement runs and commits, then its connection 'drops' before the reply:
    what a server crash or a cut network does between commit and answer."""
    real = spool.db.run
    lost: list[int] = []

    def run(fn: Any, *, what: str = "query") -> Any:
        if what != "claim":
            return real(fn, what=what)

        def flaky(conn: psycopg.Connection[Any]) -> Any:
            out = fn(conn)
            if not lost:
                lost.append(len(out))
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return out

        return real(flaky, what=what)

    monkeypatch.setattr(spool.db, "run", run)
    return lost


def test_a_claim_sent_again_after_a_lost_reply_returns_the_leases_it_took(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = make_spool(pg_url)
    spool.enqueue_many("k", range(5), job_ids=[f"j{i}" for i in range(5)])
    lost = _lose_the_first_claim_reply(spool, monkeypatch)

    leases = spool.claim(kinds="k", limit=2)

    assert lost == [2], "the first try committed two leases and its reply was lost"
    leased = sorted(j.id for j in spool.jobs(JobState.LEASED))
    assert sorted(lease.job_id for lease in leases) == leased == ["j0", "j1"]
    assert sorted(j.id for j in spool.jobs(JobState.READY)) == ["j2", "j3", "j4"]
    for lease in leases:  # the caller holds them: it can settle them
        spool.complete(lease, "done")
    assert sorted(j.id for j in spool.jobs(JobState.COMPLETED)) == ["j0", "j1"]
    spool.close()


def test_a_claim_whose_first_try_never_committed_claims_afresh(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = make_spool(pg_url)
    spool.enqueue_many("k", range(3), job_ids=[f"j{i}" for i in range(3)])
    real = spool.db.run
    failed: list[bool] = []

    def run(fn: Any, *, what: str = "query") -> Any:
        def refused(conn: psycopg.Connection[Any]) -> Any:
            if what == "claim" and not failed:
                failed.append(True)
                raise psycopg.OperationalError("connection refused")
            return fn(conn)

        return real(refused, what=what)

    monkeypatch.setattr(spool.db, "run", run)
    leases = spool.claim(kinds="k", limit=2)
    assert failed == [True]
    assert sorted(lease.job_id for lease in leases) == ["j0", "j1"]
    assert sorted(j.id for j in spool.jobs(JobState.LEASED)) == ["j0", "j1"]
    spool.close()
