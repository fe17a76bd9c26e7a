"""DESIGN.md as a demanding new user reads it: each test is one sentence of the contract that an
exploratory pass found broken, kept so it stays fixed."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from jobspool import AsyncSpool, RunReport, Spool, Worker
from jobspool.errors import InvalidJob, SpoolError
from tests.cli_harness import run_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until


def test_asyncio_run_of_run_forever_serves_until_stop_and_returns_the_report(tmp_path: Path) -> None:
    # DESIGN §5 writes `await worker.run_forever()`; from sync code that is
    # `asyncio.run(worker.run_forever())`, which must not fail once stop() ends the run.
    spool = make_spool(tmp_path / "spool")
    spool.enqueue("note", job_id="a")
    worker = Worker(spool, handlers={"note": lambda job, ctx: "done"})
    out: dict[str, Any] = {}

    def serve() -> None:
        try:
            out["report"] = asyncio.run(worker.run_forever(handle_signals=False))
        except BaseException as exc:  # surfaced by the assertion below, not by the thread
            out["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    assert spool.wait("a", timeout=30).result == "done"
    worker.stop()
    thread.join(30)
    assert "error" not in out, out.get("error")
    report = out["report"]
    assert isinstance(report, RunReport)
    assert report.completed == 1
    assert repr(report).startswith("RunReport(")


def test_an_unreachable_database_url_is_refused_naming_it_and_creates_no_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # DESIGN §9 Stores: `Spool(root)` takes a directory or a postgresql:// URL. A URL whose
    # server is not there must not silently become a directory tree named `postgresql:`.
    monkeypatch.chdir(tmp_path)
    url = "postgresql://app@localhost:5432/jobs"
    with pytest.raises(SpoolError, match="postgresql://app@localhost:5432/jobs"):
        make_spool(url)
    done = run_jobspool("enqueue", "note", root=url, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "postgresql://" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_jobs_with_an_unknown_state_raises_invalid_job_at_the_call(tmp_path: Path) -> None:
    spool = make_spool(tmp_path / "spool")
    spool.enqueue("note", job_id="a")
    with pytest.raises(InvalidJob, match="'nope'"):
        spool.jobs(state="nope")  # not only once iterated: a bad argument fails where it is given
    with pytest.raises(InvalidJob, match="a/b"):
        spool.jobs(kind="a/b")
    assert [j.id for j in spool.jobs(state="ready", kind="note")] == ["a"]


def test_demo_refuses_a_spool_that_already_holds_jobs_in_one_line_and_touches_none(
        tmp_path: Path) -> None:
    # `JOBSPOOL_ROOT` is the default root of every command, demo included: pointing at a real
    # spool, the demo ran that spool's own jobs of kind `doc` with its handler, then died on
    # their payloads with a traceback.
    root = tmp_path / "spool"
    spool = make_spool(root)
    spool.enqueue("doc", {"path": "/notes/a.md"}, job_id="mine")
    done = run_jobspool("demo", "--jobs", "5", env={"JOBSPOOL_ROOT": str(root)})
    assert done.returncode == 2
    assert done.stderr.startswith("jobspool: error: ") and done.stderr.count("\n") == 1
    assert str(root) in done.stderr and "Traceback" not in done.stderr
    assert [(j.id, j.state.value) for j in spool.jobs()] == [("mine", "ready")]


def test_wait_refuses_a_nan_or_negative_timeout_instead_of_waiting_forever(tmp_path: Path) -> None:
    # A NaN deadline is never reached: `wait("b", timeout=nan)` used to spin forever.
    spool = make_spool(tmp_path / "spool")
    spool.enqueue("note", job_id="b")
    for bad in (float("nan"), -1.0):
        with pytest.raises(InvalidJob, match="timeout"):
            spool.wait("b", timeout=bad)
    with pytest.raises(InvalidJob, match="poll_seconds"):
        spool.wait("b", timeout=1.0, poll_seconds=0)

    async def wait_async() -> None:
        await AsyncSpool(spool).wait("b", timeout=float("nan"))

    with pytest.raises(InvalidJob, match="timeout"):
        asyncio.run(wait_async())
    spool.complete(spool.claim()[0], "r")
    assert spool.wait("b", timeout=float("inf")).result == "r"  # +inf: no limit, as None


def test_cli_run_at_without_a_time_zone_is_one_line_naming_the_flag_and_the_fix(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    done = run_jobspool("enqueue", "note", "--run-at", "2030-01-01T00:00:00", root=root)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "--run-at '2030-01-01T00:00:00'" in done.stderr and "Z" in done.stderr
    assert list(make_spool(root, create=False).jobs()) == []


def test_a_worker_stopped_once_runs_again_and_a_stop_before_a_run_still_ends_that_run(
        tmp_path: Path) -> None:
    # stop() stops the run in progress; it used to stop the Worker for good: every later
    # run_until_idle() or run_forever() returned at once without claiming.
    spool = make_spool(tmp_path / "spool")
    worker = Worker(spool, handlers={"note": lambda job, ctx: "ok"})
    spool.enqueue("note", job_id="a")
    thread = threading.Thread(target=worker.run_forever, kwargs={"handle_signals": False})
    thread.start()
    spool.wait("a", timeout=30)
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()
    spool.enqueue("note", job_id="b")
    assert worker.run_until_idle().completed == 1
    worker.stop()  # asked before the run starts (a thread not yet inside run_forever)
    assert worker.run_forever(handle_signals=False).claimed == 0
    spool.enqueue("note", job_id="c")
    assert worker.run_until_idle().completed == 1
    assert {j.id: j.state.value for j in spool.jobs()} == {
        "a": "completed", "b": "completed", "c": "completed"}


def test_a_table_keyed_on_another_column_is_written_and_read_on_that_key(tmp_path: Path) -> None:
    # App(keys=...) / Worker(keys=...) name a table's key column; the worker's store merged
    # every table on `id`, so each job writing such a table was dead-lettered.
    from jobspool import App, LanceProjection

    spool = make_spool(tmp_path / "spool")
    index = tmp_path / "index"

    def note(job: Any, ctx: Any) -> None:
        ctx.upsert("notes", [{"slug": "a", "n": 1}, {"slug": "b", "n": 2}])
        ctx.delete("notes", ["b"])

    spool.enqueue("note", job_id="j")
    app = App(handlers={"note": note}, projection=str(index), keys={"notes": "slug"})
    report = Worker(spool, app).run_until_idle()
    assert (report.completed, report.dead_lettered) == (1, 0)
    table = LanceProjection(index, "notes", key="slug")
    assert table.get("a") == {"slug": "a", "n": 1, "version": 1.0, "fence": 1}
    assert table.get("b") is None  # tombstoned, hidden
    assert [r["slug"] for r in table.to_arrow().to_pylist()] == ["a"]


def test_spool_signature_shows_designs_defaults_and_stored_settings_still_win(
        tmp_path: Path) -> None:
    import inspect

    params = inspect.signature(Spool).parameters
    assert {n: params[n].default for n in ("lease_seconds", "max_attempts", "retry_base_seconds",
                                           "retry_max_seconds", "keep_terminal")} == {
        "lease_seconds": 60.0, "max_attempts": 5, "retry_base_seconds": 1.0,
        "retry_max_seconds": 300.0, "keep_terminal": 1000}
    make_spool(tmp_path / "s", lease_seconds=7.0).close()
    with make_spool(tmp_path / "s") as again:
        assert again.lease_seconds == 7.0  # the default did not override spool.json


def test_a_bad_option_creates_nothing_on_disk(tmp_path: Path) -> None:
    from jobspool.errors import InvalidJob

    with pytest.raises(InvalidJob, match="lease_seconds"):
        make_spool(tmp_path / "new", lease_seconds=0)
    assert not (tmp_path / "new").exists()


def test_a_relative_root_survives_a_chdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with make_spool("rel") as s:
        s.enqueue("k", job_id="a")
        monkeypatch.chdir("/")
        assert s.get("a").state.value == "ready"


def test_an_expired_lease_is_claimed_in_run_at_order_and_no_lease_starts_expired(
        tmp_path: Path) -> None:
    now = [1_000.0]
    with make_spool(tmp_path / "s", clock=lambda: now[0]) as s:
        s.enqueue("k", job_id="old")
        (held,) = s.claim(lease_seconds=10)
        now[0] += 5
        s.enqueue("k", job_id="young")
        now[0] += 10  # old's lease expired; young was enqueued after old
        first = s.claim(lease_seconds=1e-9)
        assert [lease.job_id for lease in first] == ["old"]
        assert first[0].expires_at > now[0]  # never handed out already expired
        assert held.token < first[0].token


def test_invalid_input_is_also_a_value_error() -> None:
    from jobspool.errors import InvalidJob

    assert issubclass(InvalidJob, ValueError)


def test_enqueue_never_writes_over_an_unreadable_file_of_the_same_id(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with make_spool(root) as s:
        (root / "ready" / "a.json").write_bytes(b"{bad")
        with pytest.warns(Warning), pytest.raises(SpoolError, match="recover"):
            s.enqueue("k", job_id="a")
        assert (root / "ready" / "a.json").read_bytes() == b"{bad"  # kept for recover
        s.recover()
        assert s.enqueue("k", job_id="a").state.value == "ready"


def test_a_stale_copy_placed_by_hand_never_runs_a_completed_job_again(tmp_path: Path) -> None:
    """An operator restoring an old `ready/` file of a job that has since completed: running
    workers notice the file, and the claim checks for a newer copy before running it."""
    root = tmp_path / "s"
    with make_spool(root) as s:
        s.enqueue("k", job_id="a")
        old = (root / "ready" / "a.json").read_bytes()
        s.complete(s.claim()[0])
        s.enqueue("k", job_id="b")
        assert [lease.job_id for lease in s.claim()] == ["b"]  # the index is warm
        (root / "ready" / "a.json").write_bytes(old)  # behind the spool's back

        def stale_copy_dropped() -> bool:
            assert [lease.job_id for lease in s.claim()] == []  # never `a` again
            return not (root / "ready" / "a.json").exists()  # the claim saw it and dropped it

        wait_until(stale_copy_dropped, 10, "a claim to drop the stale copy")
        assert s.get("a").state.value == "completed"
        assert not (root / "ready" / "a.json").exists()


def test_help_shows_the_nullable_options_defaults_and_stored_ones_still_win(
        tmp_path: Path) -> None:
    import inspect

    params = inspect.signature(Spool).parameters
    shown = {n: repr(params[n].default) for n in ("max_rescues", "keep_terminal_seconds")}
    assert shown == {"max_rescues": "10", "keep_terminal_seconds": "None"}  # not <object ...>
    make_spool(tmp_path / "s", max_rescues=3, keep_terminal_seconds=60.0).close()
    with make_spool(tmp_path / "s") as again:
        assert (again.max_rescues, again.keep_terminal_seconds) == (3, 60.0)
    with make_spool(tmp_path / "s", max_rescues=None) as unbounded:
        assert unbounded.max_rescues is None  # None given is "no limit", not "left out"
