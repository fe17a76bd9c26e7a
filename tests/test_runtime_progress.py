"""Per-job progress (issue 11): `ctx.progress(done, total, note)`, recorded cheaply by the
worker's heartbeat thread and shown by `jobspool show` and `list` while the job runs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import Context, Job, JobState, Spool, Worker
from jobspool.errors import InvalidJob
from jobspool.queue.context import Context as RunContext
from jobspool.queue.jobprogress import (
    PROGRESS_DIR,
    Progress,
    make_progress,
    read_progress,
    write_progress,
)
from tests.cli_harness import run_jobspool, start_jobspool
from tests.helpers_spool import FakeClock
from tests.spools import SpoolFactory, make_spool
from tests.waiting import wait_until

GUARD = 60.0


@contextlib.contextmanager
def _held_run(spool: Spool, progress: tuple[float, float, str],
              **options: Any) -> Iterator[Job]:
    """A worker running one `work` job whose handler reports `progress`, then waits until
    the block ends (the run is joined on the way out)."""
    release = threading.Event()

    def work(job: Job, ctx: Context) -> str:
        ctx.progress(*progress)
        release.wait(GUARD)
        return "ok"

    job = spool.enqueue("work")
    worker = Worker(spool, {"work": work}, maintenance=False, **options)
    t = threading.Thread(target=worker.run_until_idle)
    t.start()
    try:
        yield job
    finally:
        release.set()
        t.join(GUARD)


def test_progress_is_readable_while_the_job_runs_and_gone_once_it_settles(
        spool: Spool) -> None:
    with _held_run(spool, (3, 10, "step three")) as job:
        wait_until(lambda: read_progress(spool.root, spool.get(job.id)) is not None, GUARD,
                   "the handler's first progress")
        seen = read_progress(spool.root, spool.get(job.id))
        assert seen is not None
        assert (seen.done, seen.total, seen.note) == (3.0, 10.0, "step three")
        assert seen.text() == "3/10 (30%) step three"
    assert spool.get(job.id).state is JobState.COMPLETED
    assert read_progress(spool.root, spool.get(job.id)) is None
    assert not list((spool.root / PROGRESS_DIR).glob(f"{job.id}.*"))


def test_a_progress_file_from_an_earlier_run_is_not_shown_against_a_later_one(
        spool: Spool) -> None:
    job = spool.enqueue("work")
    (lease,) = spool.claim()
    write_progress(spool.root, job.id, make_progress(lease.token - 1, 5, 10, "old run"))
    assert read_progress(spool.root, spool.get(job.id)) is None
    write_progress(spool.root, job.id, make_progress(lease.token, 7, None, None))
    now = read_progress(spool.root, spool.get(job.id))
    assert now is not None and now.text() == "7"


@pytest.mark.parametrize(("done", "total", "note"), [
    (-1, None, None), (float("nan"), None, None), ("3", None, None), (True, None, None),
    (1, float("inf"), None), (1, 10, 7),
])
def test_malformed_progress_is_refused_naming_the_value(done: object, total: object,
                                                         note: object) -> None:
    with pytest.raises(InvalidJob, match=r"ctx\.progress"):
        make_progress(1, done, total, note)


def test_a_long_note_is_cut() -> None:
    p = make_progress(1, 1, 2, "x" * 10_000)
    assert isinstance(p, Progress) and len(p.note or "") == 200


def test_show_and_list_print_a_running_jobs_progress(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    release = tmp_path / "release"
    with make_spool(root) as spool:
        job = spool.enqueue("progressing", {"releasefile": str(release)})
    proc = start_jobspool("run-until-idle", "--app", "tests.apps.runtime:app", "--json",
                          "--no-maintenance", root=root)

    def cli(*args: str) -> str:
        done = run_jobspool(*args, root=root, timeout=GUARD)
        assert done.code == 0, done.err
        return done.out

    try:
        wait_until(lambda: list((root / PROGRESS_DIR).glob(f"{job.id}.*.json")), GUARD,
                   "the worker's first progress file", proc=proc)
        assert "progress: 40/100 (40%) resizing" in cli("show", job.id)
        assert orjson.loads(cli("show", job.id, "--json"))["progress"]["done"] == 40
        assert "progress=40/100 (40%) resizing" in cli("list")
        listed = orjson.loads(cli("list", "--json"))
        assert listed[0]["progress"]["note"] == "resizing"
    finally:
        release.touch()
        _, err = proc.communicate(timeout=GUARD)
    assert proc.returncode == 0, err.decode(errors="replace")
    assert "progress:" not in cli("show", job.id)  # finished: nothing left to show
    assert not list((root / PROGRESS_DIR).glob(f"{job.id}.*"))


def test_a_worker_removes_progress_files_no_current_run_owns(spool: Spool) -> None:
    dead = spool.enqueue("work")
    (lease,) = spool.claim()
    write_progress(spool.root, dead.id, make_progress(lease.token, 1, 2, "worker died"))
    spool.release(lease)  # as recovery would after the death
    orphan_dir = spool.root / PROGRESS_DIR
    write_progress(spool.root, "no-such-job", make_progress(99, 1, None, None))
    spool.enqueue("work")
    Worker(spool, {"work": lambda job, ctx: None}, maintenance=False).run_until_idle()
    assert list(orphan_dir.iterdir()) == []


def test_a_running_worker_also_removes_progress_files_left_after_its_start(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by a soak probe: pruned only at a worker's start, the file of a worker killed
    # while this one ran stayed until the restart after next.
    from jobspool.queue import monitor as runtime

    monkeypatch.setattr(runtime, "_PRUNE_PROGRESS_EVERY", 0.2)
    worker = Worker(spool, {"work": lambda job, ctx: None}, maintenance=False)
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    try:
        spool.enqueue("work", job_id="first")
        wait_until(lambda: spool.get("first").state is JobState.COMPLETED, GUARD,
                   "the worker to run")
        write_progress(spool.root, "killed-elsewhere", make_progress(7, 1, None, None))
        left = spool.root / PROGRESS_DIR / "killed-elsewhere.7.json"
        assert left.exists()
        wait_until(lambda: not left.exists(), GUARD, "the running worker to remove it")
    finally:
        worker.stop()
        thread.join(GUARD)


def test_pruning_keeps_a_live_runs_file_while_the_store_cannot_answer(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by a regression probe: a `get` failing for a moment (a database blip) read as
    # "no such job", and the file of a run still leased was deleted.
    from jobspool.errors import StoreUnavailable
    from jobspool.queue.jobprogress import prune_stale_progress

    spool.enqueue("work", job_id="live")
    (lease,) = spool.claim()
    write_progress(spool.root, "live", make_progress(lease.token, 2, 5, "running"))
    write_progress(spool.root, "gone", make_progress(3, 1, None, None))
    real_get = spool.get

    def flaky_get(job_id: str) -> Job:
        if job_id == "live":
            raise StoreUnavailable("database unavailable for a moment")
        return real_get(job_id)

    monkeypatch.setattr(spool, "get", flaky_get)
    assert prune_stale_progress(spool) == 1  # "gone" (no such job) only
    assert sorted(p.name for p in (spool.root / PROGRESS_DIR).iterdir()) == [
        f"live.{lease.token}.json"]


def test_a_dead_workers_progress_is_not_shown(tmp_path: Path) -> None:
    # The README: "A file left by a worker that died is never shown". Killed, the worker
    # left its report naming the lease's token, shown until the lease expired.
    import signal

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        job = spool.enqueue("progressing", {"releasefile": str(tmp_path / "never")})
    proc = start_jobspool("run-until-idle", "--app", "tests.apps.runtime:app",
                          "--no-maintenance", root=root)
    try:
        wait_until(lambda: list((root / PROGRESS_DIR).glob(f"{job.id}.*.json")), GUARD,
                   "the worker's first progress file", proc=proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=GUARD)
    shown = run_jobspool("show", job.id, root=root, timeout=GUARD)
    assert shown.code == 0 and "leased" in shown.out, shown.err
    assert "progress:" not in shown.out
    assert "progress=" not in run_jobspool("list", root=root, timeout=GUARD).out


def test_a_run_whose_lease_was_lost_leaves_the_holders_progress_alone(
        spool: Spool, clock: FakeClock) -> None:
    # A worker stalled past its lease, then resumed: its last flush and its settle's
    # removal hit the one file of the job, and the new holder's report vanished.
    job = spool.enqueue("work")
    (stale,) = spool.claim()
    late = RunContext(spool, stale)
    late.progress(1, 10, "stale run")
    clock.advance(31)  # past the 30 s lease
    (holder,) = spool.claim()
    assert holder.token > stale.token
    current = RunContext(spool, holder)
    current.progress(7, 10, "holder")
    current.flush_progress()
    late.flush_progress()  # the stale run's heartbeat thread, resumed
    late.drop_progress()  # and its settle
    shown = read_progress(spool.root, spool.get(job.id))
    assert shown is not None and shown.text() == "7/10 (70%) holder"


def test_a_note_with_no_utf8_form_is_refused_at_the_call() -> None:
    with pytest.raises(InvalidJob, match=r"note.*surrogate"):
        make_progress(1, 1, None, "half \ud800 a pair")


def test_the_heartbeats_go_on_when_writing_a_progress_fails_in_any_way(
        make_spool: SpoolFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A progress write that raised something other than OSError ended the heartbeat
    thread: no lease of the worker was extended again, and long jobs were taken over."""
    from jobspool.queue import context as context_mod

    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("not what the writer expected")

    monkeypatch.setattr(context_mod, "write_progress", broken)
    spool = make_spool()  # the real clock: leases are extended in real time
    with _held_run(spool, (1, 2, "half"), lease_seconds=1.5) as job:
        wait_until(lambda: spool.get(job.id).state is JobState.LEASED, GUARD, "the claim")
        first = spool.get(job.id).lease
        assert first is not None
        wait_until(lambda: (spool.get(job.id).lease or first).expires_at > first.expires_at + 0.5,
                   GUARD, "a heartbeat after the failed progress writes")
    assert spool.get(job.id).state is JobState.COMPLETED
