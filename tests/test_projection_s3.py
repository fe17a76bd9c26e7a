"""The projection on object storage (issue 16): a real S3 server (SeaweedFS) and a lying stub.

The fencing suite itself runs on s3:// too (tests/test_projection_fencing.py,
parametrized). Here: reads through `LanceProjection` with explicit storage
options, a worker writing to s3://, the server stopped and restarted in the
middle of a run, the conditional-PUT check refusing an endpoint that
overwrites, bounded commit retries, and three processes racing on one table.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import jobspool.projection.lance as lance_mod
from jobspool.app import App
from jobspool.errors import ConfigError, ProjectionError
from jobspool.projection.handler import LIVE_FILTER, make_upsert
from jobspool.projection.lance import LanceProjection, ProjectionStore
from jobspool.projection.objectstore import (
    CHECK_OPTION,
    CommitRetry,
    ConditionalPutUnsupported,
    ObjectStoreUnreachable,
    check_conditional_put,
    forget_checks,
    is_transient,
    retry_transient,
)
from jobspool.queue.worker import Worker
from tests.cli_harness import run_jobspool
from tests.s3server import S3Server
from tests.spools import make_spool
from tests.subproc import cli_env
from tests.waiting import wait_until

GUARD_SECONDS = 60.0  # a hang guard, never a performance claim

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str] | None]:
    if request.param == "local":
        return str(tmp_path / "db"), None
    server: S3Server = request.getfixturevalue("s3_server")
    return server.uri("reads"), server.options()


# --- reads and direct writes, local and s3


def test_lance_projection_reads_and_writes_through_explicit_storage_options(
    target: tuple[str, dict[str, str] | None],
) -> None:
    uri, options = target
    proj = LanceProjection(uri, "docs", storage_options=options)
    assert proj.get("a") is None and proj.to_arrow().num_rows == 0
    assert proj.upsert([{"id": "a", "text": "one"}, {"id": "b", "text": "two"}], version=1.0) == 2
    assert proj.delete("b", version=2.0) == 1
    assert proj.upsert({"id": "b", "text": "stale"}, version=1.5) == 0  # the tombstone fences it
    again = LanceProjection(uri, "docs", storage_options=options)  # another reader, same table
    assert again.get("a") == {"id": "a", "text": "one", "version": 1.0, "fence": 0}
    assert again.get("b") is None
    assert again.to_arrow().to_pylist() == [{"id": "a", "text": "one", "version": 1.0, "fence": 0}]
    assert again.count() == 1
    assert again.store.storage_options == options


def test_bad_storage_options_are_refused_with_one_line_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="storage option 'allow_http' must be a string, got bool True"):
        ProjectionStore(tmp_path / "db", storage_options={"allow_http": True})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="storage_options must be a mapping"):
        LanceProjection(tmp_path / "db", "t", storage_options=["allow_http"])  # type: ignore[arg-type]


# --- a worker writing to s3://


def _note(job: Any, ctx: Any) -> str:
    ctx.upsert("notes", {"id": job.payload["key"], "text": job.payload["text"]})
    return job.payload["key"]


def test_a_worker_given_storage_options_projects_every_job_to_s3(s3_server: S3Server,
                                                                 tmp_path: Path) -> None:
    uri = s3_server.uri("worker")
    with make_spool(tmp_path / "spool", lease_seconds=30.0) as spool:
        for i in range(25):
            spool.enqueue("note", {"key": f"k{i}", "text": f"t{i}"}, job_id=f"j{i}")
        worker = Worker(spool, {"note": _note}, projection=uri, storage_options=s3_server.options(),
                        batch_size=10, maintenance=False)
        report = worker.run_until_idle()
        assert report.completed == 25 and report.retried == 0
        assert worker.projection_store().storage_options == s3_server.options()
    rows = LanceProjection(uri, "notes", storage_options=s3_server.options()).to_arrow()
    assert sorted(rows.column("id").to_pylist()) == sorted(f"k{i}" for i in range(25))


@pytest.mark.slow
def test_the_server_stopped_mid_run_fails_and_retries_writes_which_land_after_restart(
    s3_server: S3Server, tmp_path: Path
) -> None:
    uri = s3_server.uri("outage")
    options = s3_server.options()
    with make_spool(tmp_path / "spool", lease_seconds=30.0, retry_base_seconds=0.2, retry_max_seconds=1.0,
                max_attempts=1000) as spool:
        worker = Worker(spool, {"note": _note}, projection=uri, storage_options=options,
                        batch_size=5, concurrency=2, maintenance=False)
        reports: list[Any] = []
        runner = threading.Thread(
            target=lambda: reports.append(worker.run_forever(poll_seconds=0.05, handle_signals=False)))
        for i in range(10):
            spool.enqueue("note", {"key": f"a{i}", "text": "before"}, job_id=f"a{i}")
        runner.start()
        try:
            wait_until(lambda: spool.stats().counts.get("completed", 0) == 10, 120.0, "the first 10 jobs")
            s3_server.halt()
            try:
                for i in range(10):
                    spool.enqueue("note", {"key": f"b{i}", "text": "during"}, job_id=f"b{i}")
                # Every write during the outage fails; its jobs are given back uncounted,
                # deferred (the projection's storage failing is not theirs); none completes.
                wait_until(lambda: (worker.live_report() or reports[0]).released >= 10,
                           120.0, "the writes during the outage to fail")
                completed_in_outage = spool.stats().counts.get("completed", 0)
            finally:
                s3_server.restart()
            wait_until(lambda: spool.stats().counts.get("completed", 0) == 20, 120.0, "the retries to land")
        finally:
            worker.stop()
            runner.join(60)
        assert not runner.is_alive()
        assert completed_in_outage == 10
        assert reports[0].completed == 20 and reports[0].dead_lettered == 0
        assert reports[0].retried == 0  # no attempt charged for the outage
        assert all(j.state.value == "completed" and j.attempts == 1 for j in spool.jobs())
    rows = LanceProjection(uri, "notes", storage_options=options).to_arrow().to_pylist()
    assert {r["id"]: r["text"] for r in rows} == (
        {f"a{i}": "before" for i in range(10)} | {f"b{i}": "during" for i in range(10)})


# --- the conditional-PUT check


class _Overwriter(http.server.BaseHTTPRequestHandler):
    """An endpoint that answers 200 to every PUT, If-None-Match or not (like s3rver)."""

    seen: list[tuple[str, str, str | None]] = []  # noqa: RUF012 - reset per test

    def _ok(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        type(self).seen.append((self.command, self.path, self.headers.get("If-None-Match")))
        self.send_response(200 if self.command != "DELETE" else 204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_PUT = do_DELETE = do_HEAD = _ok

    def do_GET(self) -> None:
        if "list-type=" not in self.path:
            self._ok()
            return
        # An empty listing, so that LanceDB can connect (and find no tables).
        body = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
                b'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>stub</Name>'
                b"<KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>"
                b"<IsTruncated>false</IsTruncated></ListBucketResult>")
        type(self).seen.append((self.command, self.path, None))
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stub_endpoint() -> Iterator[str]:
    _Overwriter.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Overwriter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    forget_checks()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        forget_checks()


def _stub_options(endpoint: str, **extra: str) -> dict[str, str]:
    return {"aws_endpoint": endpoint, "aws_access_key_id": "k", "aws_secret_access_key": "s",
            "aws_region": "us-east-1", "allow_http": "true", **extra}


RISK = "ignores conditional PUTs .* concurrent LanceDB commits would be lost"


def test_an_endpoint_that_overwrites_on_a_create_only_put_is_refused_in_one_line(
    stub_endpoint: str, tmp_path: Path
) -> None:
    options = _stub_options(stub_endpoint)
    store = ProjectionStore("s3://stub/db", storage_options=options)
    with pytest.raises(ConditionalPutUnsupported, match=RISK) as caught:
        store.apply([make_upsert("j", "notes", {"id": "a"}, None, 1)])
    assert "\n" not in str(caught.value) and stub_endpoint in str(caught.value)
    # The probe wrote an object, then wrote it again create-only: the stub said 200 both times.
    puts = [(m, h) for m, _p, h in _Overwriter.seen if m == "PUT"]
    assert puts == [("PUT", None), ("PUT", "*")]
    assert all(p.startswith("/stub/db/.jobspool-put-check-") for _m, p, _h in _Overwriter.seen)


@pytest.mark.parametrize("first", ["connection", "read", "key lookup"])
def test_a_store_that_connected_before_its_first_write_still_runs_the_check(
    stub_endpoint: str, first: str
) -> None:
    """The check ran only while no connection was open: a read first, or a
    LanceProjection without `key=` (it looks the key up at construction), let writes
    through to an endpoint that loses commits."""
    options = _stub_options(stub_endpoint)
    if first == "key lookup":
        projection = LanceProjection("s3://stub/db", "notes", storage_options=options)
        with pytest.raises(ConditionalPutUnsupported, match=RISK):
            projection.upsert({"id": "a", "text": "x"}, version=1.0)
    else:
        store = ProjectionStore("s3://stub/db", storage_options=options)
        assert store.connection is not None
        if first == "read":
            with contextlib.suppress(ProjectionError, OSError, ValueError, RuntimeError):
                store.table("notes").get("a")
        with pytest.raises(ConditionalPutUnsupported, match=RISK):
            store.apply([make_upsert("j", "notes", {"id": "a"}, None, 1)])
    assert ("PUT", "*") in [(m, h) for m, _p, h in _Overwriter.seen]


def test_a_reader_does_not_run_the_write_check(stub_endpoint: str) -> None:
    """The check PUTs probe objects: a reader with read-only credentials failed with
    ConditionalPutUnsupported (an S3 probe). Reads cannot lose a commit; only writes
    and maintenance are checked."""
    forget_checks()
    _Overwriter.seen.clear()
    with contextlib.suppress(ProjectionError, OSError, ValueError, RuntimeError):
        LanceProjection("s3://stub/db", "notes", storage_options=_stub_options(stub_endpoint)
                        ).get("a")
    assert [m for m, _p, _h in _Overwriter.seen if m == "PUT"] == []


@pytest.mark.parametrize("given", ["uri", "store"])
def test_a_worker_refuses_to_run_against_such_an_endpoint_and_claims_nothing(
    stub_endpoint: str, tmp_path: Path, given: str
) -> None:
    options = _stub_options(stub_endpoint)
    with make_spool(tmp_path / "spool", lease_seconds=30.0) as spool:
        spool.enqueue("note", {"key": "a", "text": "x"}, job_id="j1")
        worker = Worker(spool, {"note": _note}, storage_options=options, projection="s3://stub/db"
                        if given == "uri" else ProjectionStore("s3://stub/db", storage_options=options))
        with pytest.raises(ProjectionError, match=RISK):
            worker.run_until_idle()
        assert spool.get("j1").state.value == "ready" and spool.get("j1").attempts == 0


def _s3_app_with_a_job(tmp_path: Path) -> tuple[Path, dict[str, str | None]]:
    """An app (`s3app:app`) projecting to s3://stub/db, a spool with one job for it, and
    the environment that imports the app."""
    (tmp_path / "s3app.py").write_text(
        "from jobspool import App\n"
        "def note(job, ctx):\n    ctx.upsert('notes', {'id': 'a'})\n"
        "app = App(handlers={'note': note}, projection='s3://stub/db')\n")
    root = tmp_path / "spool"
    env: dict[str, str | None] = {"PYTHONPATH": f"{ROOT}:{tmp_path}"}
    for setup in (["init"], ["enqueue", "note", "{}"]):
        done = run_jobspool(*setup, root=root, env=env, cwd=tmp_path)
        assert done.code == 0, done.err
    return root, env


def test_the_cli_refuses_such_an_endpoint_with_one_error_line(stub_endpoint: str, tmp_path: Path) -> None:
    root, env = _s3_app_with_a_job(tmp_path)
    opts = [x for k, v in _stub_options(stub_endpoint).items() for x in ("--projection-option", f"{k}={v}")]
    proc = run_jobspool("run-until-idle", "--app", "s3app:app", *opts, root=root, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobspool: error: endpoint "), proc.stderr
    assert "ignores conditional PUTs" in lines[0] and "commits would be lost" in lines[0]
    bad = run_jobspool("run-until-idle", "--app", "s3app:app", "--projection-option", "nokey", root=root,
                       env=env, cwd=tmp_path)
    assert bad.returncode == 1 and "'nokey' is not KEY=VALUE" in bad.stderr


def test_a_worker_pool_gives_up_on_such_an_endpoint_instead_of_restarting_for_ever(
        stub_endpoint: str, tmp_path: Path) -> None:
    """Each child refused in one line and exited 1; the pool restarted it, for ever."""
    root, env = _s3_app_with_a_job(tmp_path)
    opts = [x for k, v in _stub_options(stub_endpoint).items()
            for x in ("--projection-option", f"{k}={v}")]
    proc = run_jobspool("worker", "--processes", "2", "--app", "s3app:app", *opts, root=root,
                        env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "ignores conditional PUTs" in proc.stderr
    assert "worker processes died" in proc.stderr.strip().splitlines()[-1]
    with make_spool(root) as spool:
        assert [(j.state.value, j.attempts) for j in spool.jobs()] == [("ready", 0)]


def test_an_unreachable_endpoint_is_an_outage_not_a_verdict_so_jobs_are_retried(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    forget_checks()
    store = ProjectionStore("s3://down/db", storage_options=_stub_options(closed))
    with pytest.raises(ObjectStoreUnreachable, match=r"cannot reach endpoint .* to check conditional PUTs"):
        store.apply([make_upsert("j", "notes", {"id": "a"}, None, 1)])
    with make_spool(tmp_path / "spool", lease_seconds=30.0) as spool:
        spool.enqueue("note", {"key": "a", "text": "x"}, job_id="j1")
        worker = Worker(spool, {"note": _note}, projection="s3://down/db",
                        storage_options=_stub_options(closed), maintenance=False)
        report = worker.run_until_idle()  # starts (a warning), then the write fails: deferred
        assert report.released == 1 and report.completed == 0 and report.dead_lettered == 0
        assert report.retried == 0  # the endpoint's outage is not the job's: no attempt charged
        got = spool.get("j1")
        assert (got.state.value, got.attempts) == ("retryable", 0)


def test_an_endpoint_found_lying_at_the_first_write_stops_the_worker_and_charges_no_job(
        tmp_path: Path) -> None:
    """Down when the run began (the up-front check only warned), then up but overwriting on
    create-only PUTs: the refusal was taken for a failed commit, the jobs' attempts were
    charged, and they went on to dead_letter while the worker kept running."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = _stub_options(f"http://127.0.0.1:{port}")
    forget_checks()
    started, gate = threading.Event(), threading.Event()

    def note(job: Any, ctx: Any) -> None:
        started.set()
        gate.wait(GUARD_SECONDS)
        ctx.upsert("notes", {"id": job.id})

    _Overwriter.seen = []
    server: http.server.ThreadingHTTPServer | None = None
    raised: list[BaseException] = []
    with make_spool(tmp_path / "spool", lease_seconds=30.0, max_attempts=1) as spool:
        spool.enqueue("note", {}, job_id="j1")
        worker = Worker(spool, {"note": note}, projection="s3://stub/db",
                        storage_options=options, maintenance=False)

        def run() -> None:
            try:
                worker.run_until_idle()
            except BaseException as exc:  # handed to the test thread
                raised.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        try:
            assert started.wait(GUARD_SECONDS), "the handler never started"
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Overwriter)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            gate.set()
            runner.join(GUARD_SECONDS)
            assert not runner.is_alive()
        finally:
            gate.set()
            if server is not None:
                server.shutdown()
                server.server_close()
            forget_checks()
        assert len(raised) == 1 and isinstance(raised[0], ConditionalPutUnsupported), raised
        got = spool.get("j1")
        assert (got.state.value, got.attempts) == ("ready", 0)  # given back, uncounted


def test_the_check_can_be_turned_off_explicitly(stub_endpoint: str, monkeypatch: Any) -> None:
    check_conditional_put("s3://stub/db", _stub_options(stub_endpoint, **{CHECK_OPTION: "false"}))
    monkeypatch.setenv("JOBSPOOL_S3_CHECK_CONDITIONAL_PUT", "0")
    check_conditional_put("s3://stub/db", _stub_options(stub_endpoint))
    assert _Overwriter.seen == []  # not even asked


def test_seaweedfs_passes_the_check_once_per_process(s3_server: S3Server, monkeypatch: Any) -> None:
    forget_checks()
    calls: list[str] = []
    import jobspool.projection.objectstore as objstore

    real = objstore.s3_request

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append(args[1])
        return real(*args, **kw)

    monkeypatch.setattr(objstore, "s3_request", counting)
    check_conditional_put(s3_server.uri(), s3_server.options())
    check_conditional_put(s3_server.uri(), s3_server.options())  # same endpoint: remembered
    assert calls == ["PUT", "PUT", "DELETE"]


# --- bounded retries of commits whose outcome is unknown


def test_a_commit_whose_result_is_unknown_is_retried_and_lands_once(
    target: tuple[str, dict[str, str] | None], monkeypatch: Any
) -> None:
    uri, options = target
    store = ProjectionStore(uri, storage_options=options, commit_retry=CommitRetry(base_seconds=0.01))
    assert store.apply([make_upsert("seed", "notes", {"id": "s"}, None, 1)]).ok
    real, raised = lance_mod._execute_merge, []  # noqa: SLF001 - the seam the retries wrap

    def flaky(tbl: Any, key: str, batch: pa.Table, timeout: Any) -> Any:
        if len(raised) < 2:
            raised.append(1)
            raise RuntimeError("LanceError(IO): Commit result unknown; SlowDown (503)")
        return real(tbl, key, batch, timeout)

    monkeypatch.setattr(lance_mod, "_execute_merge", flaky)
    before = store.table("notes").version()
    result = store.apply([make_upsert("j", "notes", {"id": "a"}, None, 2)])
    assert result.ok and result.tables == {"notes": 1} and len(raised) == 2
    assert store.table("notes").version() == before + 1
    assert store.table("notes").count() == 2


def test_a_commit_that_keeps_failing_fails_its_jobs_and_writes_nothing(
    tmp_path: Path, monkeypatch: Any
) -> None:
    store = ProjectionStore(tmp_path / "db", commit_retry=CommitRetry(attempts=3, base_seconds=0.01))
    assert store.apply([make_upsert("seed", "notes", {"id": "s"}, None, 1)]).ok
    tries: list[int] = []

    def down(tbl: Any, key: str, batch: pa.Table, timeout: Any) -> Any:
        tries.append(1)
        raise RuntimeError("Generic S3 error: error sending request: connection refused")

    monkeypatch.setattr(lance_mod, "_execute_merge", down)
    result = store.apply([make_upsert("j", "notes", {"id": "a"}, None, 2)])
    assert set(result.failed) == {"j"} and result.tables == {} and len(tries) == 3
    assert store.table("notes").get("a") is None


def test_only_transient_errors_are_retried_and_within_the_budget() -> None:
    assert is_transient(RuntimeError("Commit result unknown"))
    assert is_transient(OSError("LanceError(IO): commit of version 7 is unknown: the commit may or may not "
                                "have been applied; check the table state before retrying"))
    assert is_transient(OSError("Service Unavailable: SlowDown, please reduce your request rate"))
    assert is_transient(TimeoutError())
    assert not is_transient(ValueError("Schema error: field 'x' not found"))
    assert not is_transient(ProjectionError("table 'x' was created concurrently"))
    slept: list[float] = []
    policy = CommitRetry(attempts=10, base_seconds=1.0, max_seconds=4.0, budget=6.0)
    with pytest.raises(RuntimeError, match="result unknown"):
        retry_transient(lambda: (_ for _ in ()).throw(RuntimeError("Commit result unknown")),
                        policy, sleep=slept.append)
    assert 0 < len(slept) < 9 and sum(slept) <= 6.0
    with pytest.raises(ValueError, match="bad"):
        retry_transient(lambda: (_ for _ in ()).throw(ValueError("bad")), policy, sleep=slept.append)


# --- maintenance is bounded on object storage too


def test_maintenance_of_an_s3_projection_runs_within_its_budget(s3_server: S3Server) -> None:
    from jobspool.projection.maintenance import maintain

    store = ProjectionStore(s3_server.uri("maint"), storage_options=s3_server.options())
    for n in range(4):
        assert store.apply([make_upsert(f"j{n}", t, {"id": f"k{n}"}, None, n) for t in ("a", "b")]).ok
    done = maintain(store, budget_seconds=60.0)
    assert {t.table: t.outcome for t in done.tables} == {"a": "optimized", "b": "optimized"}
    spent = maintain(store, budget_seconds=0.0)  # nothing may start once the budget is spent
    assert {t.outcome for t in spent.tables} == {"deferred"}
    assert all(t.reason == "budget exhausted" for t in spent.tables)
    assert store.table("a").count() == 4


def test_a_slow_call_on_s3_is_cut_off_at_the_budget_and_the_next_run_resumes_there(
    s3_server: S3Server, monkeypatch: Any
) -> None:
    import jobspool.projection.maintenance as maint
    from jobspool.projection.maintenance_state import read_maintenance_state

    uri = s3_server.uri("slowmaint")
    store = ProjectionStore(uri, storage_options=s3_server.options())
    assert store.apply([make_upsert(f"j{t}", t, {"id": "k"}, None, 1) for t in ("a", "b")]).ok
    release, entered = threading.Event(), threading.Event()
    real = maint._optimize  # noqa: SLF001 - the seam maintenance calls LanceDB through

    def stuck(tbl: Any, cleanup: Any) -> None:
        entered.set()
        release.wait(120)  # a compaction on a slow object store
        real(tbl, cleanup)

    monkeypatch.setattr(maint, "_optimize", stuck)
    try:
        # call_timeout far beyond the test's own timeout: only the budget can end this run.
        report = maint.maintain(store, budget_seconds=1.0, call_timeout=10_000.0)
        assert entered.is_set()
        assert [(t.table, t.outcome, t.reason) for t in report.tables] == [
            ("a", "deferred", "budget exhausted"), ("b", "deferred", "budget exhausted")]
        assert read_maintenance_state(uri)["resume_at"] == "a"  # kept in memory for s3://
        busy = maint.maintain(store, tables=["a"], budget_seconds=60.0)
        assert busy.tables[0].outcome == "skipped"  # the cut-off call still runs
    finally:
        release.set()
    monkeypatch.setattr(maint, "_optimize", real)
    wait_until(lambda: maint.maintain(store, tables=["a"]).tables[0].outcome == "optimized",
               120.0, "the abandoned call to finish")


# --- three processes, overlapping keys, one table on s3


WRITER = r"""
import json, sys, time
from pathlib import Path
from jobspool.projection.handler import make_upsert
from jobspool.projection.lance import ProjectionStore

uri, options = sys.argv[1], json.loads(sys.argv[2])
me, rounds, go = int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
store = ProjectionStore(uri, storage_options=options)
store.open("shared")  # import lancedb, pass the endpoint check and connect before the start line
Path(f"{go}.ready{me}").touch()
while not go.exists():
    time.sleep(0.005)
for r in range(rounds):
    writes = [make_upsert(f"p{me}-r{r}-i{i}", "shared", {"id": f"k{r}-{i}", "by": me},
                          float(r * 10 + (i + me) % 3), 1000 * r + 10 * i + me) for i in range(6)]
    for _ in range(30):
        result = store.apply(writes)
        assert not result.rejected, result.rejected
        if not result.failed:
            break
    else:
        raise SystemExit(f"process {me}: round {r} kept failing: {result.failed}")
"""

PROCS, ROUNDS = (1, 2, 3), 6


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_three_processes_writing_overlapping_keys_on_s3_keep_the_highest_version(
    s3_server: S3Server, tmp_path: Path
) -> None:
    uri, options = s3_server.uri("race"), s3_server.options()
    assert ProjectionStore(uri, storage_options=options).apply(
        [make_upsert("init", "shared", {"id": "init", "by": 0}, 0.0, 0)]).ok
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, uri, json.dumps(options), str(me), str(ROUNDS),
                               str(go)], cwd=ROOT, env=cli_env(PYTHONPATH=str(ROOT)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me in PROCS]
    try:
        wait_until(lambda: all((tmp_path / f"go.ready{me}").exists() or procs[me - 1].poll() is not None
                               for me in PROCS), 120.0, "the writers to get ready")
        go.touch()
        outputs = [p.communicate(timeout=200) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-2000:]
    want: dict[str, tuple[float, int]] = {}
    for me in PROCS:
        for r in range(ROUNDS):
            for i in range(6):
                cand = (float(r * 10 + (i + me) % 3), 1000 * r + 10 * i + me)
                want[f"k{r}-{i}"] = max(want.get(f"k{r}-{i}", cand), cand)
    raw = ProjectionStore(uri, storage_options=options).open("shared")
    assert raw is not None
    rows = raw.search().where(LIVE_FILTER).limit(None).to_arrow().to_pylist()
    keys = [r["id"] for r in rows]
    assert len(keys) == len(set(keys)), "a key was inserted twice"
    assert {r["id"]: (r["version"], r["fence"]) for r in rows if r["id"] != "init"} == want



@pytest.mark.parametrize(("options", "says"), [
    ({"aws_endpint": "https://s3.example"}, "did you mean 'aws_endpoint'"),
    ({"aws_secret_acces_key": "s"}, "did you mean 'aws_secret_access_key'"),
    ({"aws_endpoint": "http://127.0.0.1:9000"}, "allow_http=true"),
])
def test_a_misspelt_option_or_an_http_endpoint_without_allow_http_is_refused_up_front(
        tmp_path: Path, options: dict[str, str], says: str) -> None:
    """LanceDB ignores a name it does not know (`aws_endpint` sent the projection to AWS
    itself) and refuses http without allow_http, each at connect: every job was charged
    (an S3 probe). Options it may know and we do not still pass."""
    with pytest.raises(ConfigError, match=says):
        LanceProjection("s3://bucket/idx", "t", storage_options=options)
    with pytest.raises(ConfigError, match=says):
        App(handlers={}, projection="s3://bucket/idx", storage_options=options)
    assert ProjectionStore(tmp_path / "db", storage_options={"a_newer_option": "1"})


def test_a_store_that_answers_with_a_refusal_is_not_said_to_be_silent(
        s3_server: S3Server) -> None:
    """An HTTP status is an answer: a missing bucket (404) or refused credentials (403)
    were reported as "its storage did not answer (HTTP 404)", sending operators to the
    network."""
    with pytest.raises(ProjectionError) as caught:
        LanceProjection("s3://no-such-bucket-jobspool/p", "t",
                        storage_options=s3_server.options()).count()
    text = str(caught.value)
    assert "refused (HTTP 404" in text and "did not answer" not in text, text
