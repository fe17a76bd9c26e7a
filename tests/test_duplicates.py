"""The duplicate policy of enqueue (DESIGN §9): keep, replace, error — against every state,
after pruning, with unique states, and whether the caller can tell that a job was created."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from jobspool import EnqueueResult, Spool
from jobspool.errors import DuplicateJob, InvalidJob, JobNotFound, JobspoolError
from jobspool.queue.machine import Failure
from tests.helpers_spool import FakeClock, job_files

JOB = "d1"
OLD = {"v": 1}
NEW = {"v": 2}


def _prepared(spool: Spool) -> None:
    spool.prepare("k", OLD, job_id=JOB)


def _ready(spool: Spool) -> None:
    spool.enqueue("k", OLD, job_id=JOB)


def _scheduled(spool: Spool) -> None:
    spool.enqueue("k", OLD, job_id=JOB, delay=600)


def _retryable(spool: Spool) -> None:
    spool.enqueue("k", OLD, job_id=JOB)
    (lease,) = spool.claim()
    spool.fail(lease, "boom", delay=600)


def _leased(spool: Spool) -> None:
    spool.enqueue("k", OLD, job_id=JOB)
    spool.claim()


def _completed(spool: Spool) -> None:
    spool.enqueue("k", OLD, job_id=JOB)
    (lease,) = spool.claim()
    spool.complete(lease, {"done": 1})


def _dead_letter(spool: Spool) -> None:
    spool.enqueue("k", OLD, job_id=JOB)
    (lease,) = spool.claim()
    spool.fail(lease, Failure("fatal", traceback="Traceback ...\nValueError: fatal"),
               retryable=False)
    assert spool.get(JOB).traceback


def _canceled(spool: Spool) -> None:
    spool.enqueue("k", OLD, job_id=JOB)
    spool.cancel(JOB)


def _pruned(spool: Spool) -> None:
    _completed(spool)
    assert spool.prune(keep=0).pruned == (JOB,)


SETUPS: dict[str, Callable[[Spool], None]] = {
    "prepared": _prepared, "ready": _ready, "scheduled": _scheduled, "retryable": _retryable,
    "leased": _leased, "completed": _completed, "dead_letter": _dead_letter,
    "canceled": _canceled, "pruned": _pruned,
}
# state before -> (outcome, state after) per policy; "refused" raises DuplicateJob.
EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    "keep": {
        "prepared": ("existing", "prepared"), "ready": ("existing", "ready"),
        "scheduled": ("existing", "retryable"), "retryable": ("existing", "retryable"),
        "leased": ("existing", "leased"), "completed": ("existing", "completed"),
        "dead_letter": ("existing", "dead_letter"), "canceled": ("reopened", "ready"),
        "pruned": ("created", "ready"),
    },
    "error": {
        **{s: ("refused", s) for s in ("prepared", "ready", "retryable", "leased", "completed",
                                       "dead_letter", "canceled")},
        "scheduled": ("refused", "retryable"),
        "pruned": ("created", "ready"),
    },
    "replace": {
        "prepared": ("replaced", "prepared"), "ready": ("replaced", "ready"),
        "scheduled": ("replaced", "ready"), "retryable": ("replaced", "ready"),
        "leased": ("refused", "leased"), "completed": ("replaced", "ready"),
        "dead_letter": ("replaced", "ready"), "canceled": ("replaced", "ready"),
        "pruned": ("created", "ready"),
    },
}


@pytest.mark.parametrize("before", list(SETUPS))
@pytest.mark.parametrize("policy", list(EXPECTED))
def test_each_duplicate_policy_against_each_state_does_what_the_table_says(
        spool: Spool, spool_root: Path, policy: str, before: str) -> None:
    SETUPS[before](spool)
    outcome, after = EXPECTED[policy][before]
    files_before = job_files(spool_root)
    old = None if before == "pruned" else spool.get(JOB)
    if outcome == "refused":
        with pytest.raises(DuplicateJob) as info:
            spool.enqueue("k", NEW, job_id=JOB, on_conflict=policy)
        assert info.value.job_id == JOB
        assert JOB in str(info.value) and "\n" not in str(info.value)
        assert job_files(spool_root) == files_before  # nothing written
        assert spool.get(JOB) == old
        return
    result = spool.enqueue_result("k", NEW, job_id=JOB, on_conflict=policy)
    assert isinstance(result, EnqueueResult)
    assert result.outcome == outcome
    assert result.created is (outcome != "existing")
    assert result.job.state.value == after
    assert spool.get(JOB) == result.job
    if outcome == "existing":
        assert result.job == old
        assert job_files(spool_root) == files_before
    else:
        assert result.job.payload == NEW
        assert result.job.attempts == 0 and result.job.last_error is None
        assert result.job.traceback is None
        assert result.job.result is None
        assert job_files(spool_root) == {JOB: [after]}


def test_plain_enqueue_returns_a_job_whatever_the_policy(spool: Spool) -> None:
    first = spool.enqueue("k", OLD, job_id=JOB)
    assert spool.enqueue("k", NEW, job_id=JOB) == first
    replaced = spool.enqueue("k", NEW, job_id=JOB, on_conflict="replace")
    assert replaced.payload == NEW and replaced.revision == first.revision + 1


def test_replace_makes_a_completed_job_run_again_and_a_worker_sees_the_new_payload(
        spool: Spool) -> None:
    _completed(spool)
    spool.enqueue("k", NEW, job_id=JOB, on_conflict="replace")
    (lease,) = spool.claim()
    assert lease.job.payload == NEW and lease.job.attempts == 1
    assert spool.complete(lease, "again").result == "again"


def test_replace_keeps_a_prepared_jobs_reservations_so_its_commit_publishes_the_new_content(
        spool: Spool) -> None:
    reservation = spool.prepare("k", OLD, job_id=JOB)
    spool.enqueue("k", NEW, job_id=JOB, on_conflict="replace")
    published = spool.commit(reservation)
    assert published.state.value == "ready" and published.payload == NEW


def test_replace_can_change_kind_priority_and_time(spool: Spool, clock: FakeClock) -> None:
    spool.enqueue("k", OLD, job_id=JOB)
    new = spool.enqueue("other.kind", NEW, job_id=JOB, on_conflict="replace", priority=-3,
                        run_at=clock.now + 60)
    assert (new.kind, new.priority, new.run_at, new.state.value, new.status) == (
        "other.kind", -3, clock.now + 60, "retryable", "scheduled")
    assert spool.claim() == []
    clock.advance(60)
    assert [lease.job_id for lease in spool.claim()] == [JOB]


def test_unique_states_replace_an_existing_job_outside_them(spool: Spool) -> None:
    _completed(spool)
    result = spool.enqueue_result("k", NEW, job_id=JOB, unique_states=("ready", "leased"))
    assert (result.outcome, result.job.state.value, result.job.payload) == (
        "replaced", "ready", NEW)
    # Now it is ready, one of the unique states: the default policy keeps it.
    again = spool.enqueue_result("k", {"v": 3}, job_id=JOB, unique_states=("ready", "leased"))
    assert (again.outcome, again.job.payload) == ("existing", NEW)
    with pytest.raises(DuplicateJob):
        spool.enqueue("k", {"v": 3}, job_id=JOB, unique_states=["ready"], on_conflict="error")


def test_a_leased_job_always_conflicts_even_outside_unique_states(spool: Spool) -> None:
    _leased(spool)
    kept = spool.enqueue_result("k", NEW, job_id=JOB, unique_states=("ready",))
    assert (kept.outcome, kept.job.state.value, kept.job.payload) == ("existing", "leased", OLD)
    with pytest.raises(DuplicateJob, match="running"):
        spool.enqueue("k", NEW, job_id=JOB, on_conflict="replace")


def test_an_error_policy_refuses_the_whole_batch_when_one_id_is_taken(
        spool: Spool, spool_root: Path) -> None:
    _ready(spool)
    before = job_files(spool_root)
    with pytest.raises(DuplicateJob):
        spool.enqueue_many("k", [1, 2], job_ids=["fresh", JOB], on_conflict="error")
    assert job_files(spool_root) == before
    with pytest.raises(JobNotFound):
        spool.get("fresh")


def test_enqueue_many_results_say_which_jobs_were_created(spool: Spool) -> None:
    _ready(spool)
    results = spool.enqueue_many_results("k", [1, 2, 3], job_ids=["a", JOB, "a"])
    assert [(r.job.id, r.outcome, r.created) for r in results] == [
        ("a", "created", True), (JOB, "existing", False), ("a", "existing", False)]


@pytest.mark.parametrize("bad", ["skip", "KEEP", "", None, 1])
def test_an_unknown_duplicate_policy_is_refused_naming_it_and_nothing_is_written(
        spool: Spool, spool_root: Path, bad: object) -> None:
    with pytest.raises(InvalidJob, match="on_conflict") as info:
        spool.enqueue("k", OLD, job_id=JOB, on_conflict=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)
    assert job_files(spool_root) == {}


def test_an_unknown_unique_state_is_refused_naming_it(spool: Spool, spool_root: Path) -> None:
    with pytest.raises(InvalidJob, match="'running'"):
        spool.enqueue("k", OLD, job_id=JOB, unique_states=("ready", "running"))
    assert job_files(spool_root) == {}


def test_duplicate_job_is_a_jobspool_error_that_pickles() -> None:
    err = DuplicateJob("x1", "leased", "it is running")
    assert isinstance(err, JobspoolError)
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.job_id, back.state, str(back)) == (
        DuplicateJob, "x1", "leased", str(err))


def test_cli_on_conflict_error_exits_2_and_keep_notes_the_existing_job(
        spool_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jobspool.cli import main

    root = str(spool_root)
    assert main(["--root", root, "init"]) == 0
    assert main(["--root", root, "enqueue", "k", '{"v": 1}', "--id", JOB]) == 0
    capsys.readouterr()
    assert main(["--root", root, "enqueue", "k", '{"v": 2}', "--id", JOB]) == 0
    out, err = capsys.readouterr()
    assert out.split() == [JOB, "ready"] and "already exists" in err
    assert main(["--root", root, "enqueue", "k", '{"v": 2}', "--id", JOB,
                 "--on-conflict", "error"]) == 2  # refused (DESIGN §8), not bad input
    err = capsys.readouterr().err
    assert err.startswith("jobspool: error: ") and JOB in err and err.count("\n") == 1
    assert main(["--root", root, "enqueue", "k", '{"v": 2}', "--id", JOB,
                 "--on-conflict", "replace", "--json"]) == 0
    assert '"v": 2' in capsys.readouterr().out
    assert main(["--root", root, "enqueue", "k", "--on-conflict", "maybe"]) == 1
    assert "maybe" in capsys.readouterr().err
