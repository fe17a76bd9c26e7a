"""What an idle `run_until_idle` reports it left behind, on both stores (tests/store_params.py):
due jobs of kinds it has no handler for, its own kinds' jobs not due yet and when the first
comes due. Counted by the store (`Spool.waiting`), not by reading every waiting job."""

from __future__ import annotations

from pathlib import Path

from jobspool import Context, Job, Spool, Worker


def _noop(job: Job, ctx: Context) -> None:
    return None


def test_a_drain_reports_other_kinds_due_and_its_own_kinds_waiting(any_spool: Spool) -> None:
    any_spool.enqueue_many("other", [1, 2, 3])
    any_spool.enqueue("third", 1)
    any_spool.enqueue("other", 4, delay=3600)  # not due: not counted as unhandled
    later = any_spool.enqueue("mine", 1, delay=600)
    any_spool.enqueue("mine", 2, delay=900)
    any_spool.enqueue_many("mine", [3, 4])
    report = Worker(any_spool, {"mine": _noop}, maintenance=False).run_until_idle()
    assert report.completed == 2
    assert report.unhandled == {"other": 3, "third": 1}
    assert (report.waiting, report.waiting_due) == (2, 0)
    assert report.next_due_in is not None
    assert abs(report.next_due_in - (later.run_at - any_spool.now())) < 30


def test_waiting_counts_per_kind_what_a_claim_could_take_now_or_later(any_spool: Spool) -> None:
    any_spool.enqueue_many("a", [1, 2])
    first = any_spool.enqueue("b", 1, delay=100)
    any_spool.enqueue("b", 2, delay=200)
    [lease] = any_spool.claim(kinds=["a"], limit=1)  # leased: no longer waiting
    counts = any_spool.waiting()
    assert set(counts) == {"a", "b"}
    assert (counts["a"].due, counts["a"].later, counts["a"].next_at) == (1, 0, None)
    assert (counts["b"].due, counts["b"].later) == (0, 2)
    assert counts["b"].next_at is not None and abs(counts["b"].next_at - first.run_at) < 5
    any_spool.complete(lease)
    any_spool.claim(kinds=["a"], limit=1)
    assert "a" not in any_spool.waiting()


def test_a_job_file_placed_by_hand_a_moment_ago_is_counted(tmp_path: Path) -> None:
    """The file spool counts from its claim index, which looks for files placed behind its
    back once a second: one placed just before the count was missed by the run's report."""
    import shutil

    with Spool(tmp_path / "other") as elsewhere:
        placed = elsewhere.enqueue("other", 1)
    with Spool(tmp_path / "s") as spool:
        spool.enqueue("mine", 1)
        assert spool.waiting().keys() == {"mine"}  # the index is fresh, and checked now
        shutil.copy(tmp_path / "other" / "ready" / f"{placed.id}.json",
                    tmp_path / "s" / "ready" / f"{placed.id}.json")
        counts = spool.waiting()
        assert counts["other"].due == 1
