"""A claim whose reply is lost after it committed: sent again, it adopts its own leases."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from jobspool.queue.states import JobState
from tests.spools import make_spool


def _lose_the_first_reply(spool: Any, monkeypatch: pytest.MonkeyPatch, what: str) -> list[Any]:
    """The first statement `what` runs and commits, then its connection 'drops' before the
    reply: what a server crash or a cut network does between commit and answer. Returns
    what each lost try had returned."""
    real = spool.db.run
    lost: list[Any] = []

    def run(fn: Any, *, what: str = "query") -> Any:
        if what != wanted:
            return real(fn, what=what)

        def flaky(conn: psycopg.Connection[Any]) -> Any:
            out = fn(conn)
            if not lost:
                lost.append(out)
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return out

        return real(flaky, what=what)

    wanted = what
    monkeypatch.setattr(spool.db, "run", run)
    return lost


def test_a_claim_sent_again_after_a_lost_reply_returns_the_leases_it_took(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = make_spool(pg_url)
    spool.enqueue_many("k", range(5), job_ids=[f"j{i}" for i in range(5)])
    lost = _lose_the_first_reply(spool, monkeypatch, "claim")

    leases = spool.claim(kinds="k", limit=2)

    assert [len(x) for x in lost] == [2], "the first try committed two leases; reply lost"
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


@pytest.mark.parametrize("on_conflict", ["error", "keep", "replace"])
def test_an_enqueue_of_given_ids_sent_again_after_a_lost_reply_reports_them_created(
        pg_url: str, monkeypatch: pytest.MonkeyPatch, on_conflict: str) -> None:
    # Found in the robustness pass: sent again, the insert met the rows its own first try
    # had committed and called them a conflict: `DuplicateJob` for a job that was not one.
    spool = make_spool(pg_url)
    lost = _lose_the_first_reply(spool, monkeypatch, "enqueue")
    results = spool.enqueue_many_results("k", [{"n": 1}, (2, 3)], job_ids=["a", "b"],
                                         on_conflict=on_conflict)
    assert len(lost) == 1
    assert [(r.job.id, r.outcome) for r in results] == [("a", "created"), ("b", "created")]
    assert [(j.id, j.revision, j.payload) for j in spool.jobs()] == [
        ("a", 1, {"n": 1}), ("b", 1, [2, 3])]
    spool.close()


def test_a_prepare_sent_again_after_a_lost_reply_holds_one_reservation(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = make_spool(pg_url)
    lost = _lose_the_first_reply(spool, monkeypatch, "enqueue")
    reservation = spool.prepare("k", {"n": 1}, job_id="p")
    assert len(lost) == 1
    job = spool.get("p")
    assert job.state is JobState.PREPARED and job.reservations == (reservation.reservation_id,)
    spool.commit(reservation)
    assert spool.get("p").state is JobState.READY
    spool.close()


def test_an_enqueue_meeting_another_producers_job_of_the_same_id_still_conflicts(
        pg_url: str) -> None:
    # The other side of the rule above: a row another call wrote (another creation time)
    # is a conflict as before, even with the same kind and payload.
    from jobspool import DuplicateJob

    spool = make_spool(pg_url)
    spool.enqueue("k", {"n": 1}, job_id="a")
    with pytest.raises(DuplicateJob):
        spool.enqueue("k", {"n": 1}, job_id="a", on_conflict="error")
    spool.close()


@pytest.mark.parametrize("count", [1, 3])
def test_an_enqueue_of_generated_ids_sent_again_after_a_lost_reply_reports_them_created(
        pg_url: str, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    # The fast insert of generated ids has no ON CONFLICT clause: sent again, it meets the
    # rows its first try committed and must fall back, not fail, and not call its own
    # jobs "existing" (it did, before the fast form).
    spool = make_spool(pg_url)
    lost = _lose_the_first_reply(spool, monkeypatch, "enqueue")
    results = spool.enqueue_many_results("k", [{"n": n} for n in range(count)])
    assert len(lost) == 1
    assert [r.outcome for r in results] == ["created"] * count
    stored = sorted((j.id, j.revision, j.payload["n"]) for j in spool.jobs())
    assert stored == sorted((r.job.id, 1, n) for n, r in enumerate(results))
    spool.close()


def test_a_generated_id_meeting_another_job_is_reported_existing_not_created(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ids are random (80 bits): a collision is all but impossible, but if one happens the
    # job already there is someone else's and is left alone, as before the fast insert.
    import jobspool.queue.arguments as arguments

    spool = make_spool(pg_url)
    spool.enqueue("k", {"n": 1}, job_id="taken")
    monkeypatch.setattr(arguments, "job_ids_for", lambda n, ids: ["taken"] * n)
    result = spool.enqueue_result("k", {"n": 2})
    assert (result.outcome, result.job.payload) == ("existing", {"n": 1})
    assert [(j.id, j.payload) for j in spool.jobs()] == [("taken", {"n": 1})]
    spool.close()
