"""The PostgreSQL store under real OS processes (issue 16): several workers draining one queue
exactly once, SIGKILLed workers, a late completion after a stall, the server restarted and
crashed mid-run, and the CLI end to end with `--root URL`.

Double runs are detected two independent ways: every handler run appends
`<job_id> <pid> <token> <attempt>` to its process's log (tests/apps/simple.py), and every
completed job's stored result names the token of the run that completed it. Deadlines only
guard against hangs; they are never performance claims.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState
from tests.cli_harness import reap, run_jobspool, start_jobspool
from tests.helpers_spool import stat_counts
from tests.pgserver import PgServer
from tests.spools import make_spool
from tests.subproc import REPO, cli_env
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
APP = "tests.apps.simple:app"


def _log_env(log: Path | None) -> dict[str, str | None]:
    return {"JOBSPOOL_TEST_LOG": str(log) if log else None}


def _finish(proc: subprocess.Popen[bytes], timeout: float = 240) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        reap(proc)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _ok(url: str, *args: str, log: Path | None = None) -> str:
    rc, out, err = _finish(start_jobspool(*args, env=_log_env(log), root=url))
    assert rc == 0, f"jobspool {' '.join(args)} exited {rc}: {err}"
    assert "Traceback" not in err, err
    return out


def _runs(logs: list[Path]) -> list[tuple[str, int]]:
    """(job_id, token) of every handler run in the logs."""
    runs = []
    for log in logs:
        if log.exists():
            for line in log.read_text().splitlines():
                job_id, _pid, token, _attempt = line.split()
                runs.append((job_id, int(token)))
    return runs


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate()


def _enqueue(url: str, n: int, kind: str = "work", payload: Any = None,
             **options: Any) -> list[str]:
    # The first open creates the schema with these settings: every job stays to be counted.
    with make_spool(url, keep_terminal=100_000) as spool:
        return [j.id for start in range(0, n, 1000)
                for j in spool.enqueue_many(kind, [payload or {"i": i}
                                                   for i in range(start, min(n, start + 1000))],
                                            **options)]


def _holds_leases(url: str, pid: int, timeout: float = 15.0) -> bool:
    """Whether worker `pid` holds a lease, waiting up to `timeout` for it to claim one."""
    deadline = time.monotonic() + timeout
    with make_spool(url) as spool:
        while time.monotonic() < deadline:
            if any(j.lease is not None and f":{pid}:" in j.lease.owner
                   for j in spool.jobs(state="leased")):
                return True
            if stat_counts(spool.stats())["completed"] >= spool.stats().total:
                return False
            time.sleep(0.02)
    return False


def _leases_of(url: str, pid: int) -> int:
    """How many leases the (dead) worker `pid` still holds."""
    with make_spool(url) as spool:
        return sum(1 for j in spool.jobs(state="leased")
                   if j.lease is not None and f":{pid}:" in j.lease.owner)


def _completed(url: str) -> int:
    with make_spool(url) as spool:
        return stat_counts(spool.stats())["completed"]


def _assert_all_completed_by_a_logged_run(url: str, ids: list[str],
                                          runs: list[tuple[str, int]]) -> None:
    with make_spool(url) as spool:
        jobs = {j.id: j for j in spool.jobs()}
    assert sorted(jobs) == sorted(ids), "a job was lost or invented"
    assert Counter(j.state for j in jobs.values()) == Counter({JobState.COMPLETED: len(ids)})
    ran = set(runs)
    for job in jobs.values():
        assert job.lease is None
        # The stored completion is that of a run that really handled the job, under its token
        # (the `slow` kind's result names no token; its runs are counted by the caller).
        if "token" in job.result:
            assert (job.id, job.result["token"]) in ran, job


# ---------------------------------------------------------------- exactly once


def test_four_worker_processes_run_two_thousand_jobs_each_exactly_once(pg_url: str,
                                                                      tmp_path: Path) -> None:
    ids = _enqueue(pg_url, 8000)
    logs = [tmp_path / f"worker-{i}.log" for i in range(4)]
    procs = [start_jobspool("run-until-idle", "--app", APP, "--json", "--concurrency", "4",
                            "--batch-size", "50", env=_log_env(log), root=pg_url)
             for log in logs]
    reports = []
    for proc in procs:
        rc, out, err = _finish(proc)
        assert rc == 0 and "Traceback" not in err, err
        reports.append(orjson.loads(out))
    runs = _runs(logs)
    assert Counter(job_id for job_id, _ in runs) == Counter(dict.fromkeys(ids, 1))
    assert sum(r["completed"] for r in reports) == len(ids)
    assert sum(r["lease_lost"] for r in reports) == 0
    _assert_all_completed_by_a_logged_run(pg_url, ids, runs)
    with make_spool(pg_url) as spool:
        assert {j.attempts for j in spool.jobs()} == {1}


def test_sigkilled_workers_lose_no_job_and_the_sweep_reclaims_their_leases(
        pg_url: str, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("JOBSPOOL_CRASH_SEED", "1616")))
    log = tmp_path / "handled.log"
    # 10 ms a job: a worker is always holding leases, so a kill leaves some behind.
    ids = _enqueue(pg_url, 2000, payload={"sleep": 0.01}, max_attempts=1000)

    def worker() -> subprocess.Popen[bytes]:
        return start_jobspool("worker", "--app", APP, "--kinds", "work", "--concurrency", "4",
                              "--batch-size", "40", "--lease-seconds", "1", env=_log_env(log),
                              root=pg_url)

    workers = [worker() for _ in range(3)]
    orphaned = 0  # leases a killed worker still held once it was dead
    try:
        wait_until(lambda: _completed(pg_url) >= 200, timeout=120, what="the workers to start")
        round_ = 0
        # Six kills, and more until one left leases behind (a worker between batches holds
        # none; on a loaded machine that window is wide): those must be taken back.
        while round_ < 6 or (orphaned == 0 and round_ < 40 and _completed(pg_url) < len(ids)):
            time.sleep(rng.uniform(0.05, 0.3))
            n = rng.randrange(len(workers))
            pid = workers[n].pid
            _holds_leases(pg_url, pid)
            _kill(workers[n])
            orphaned += _leases_of(pg_url, pid)
            if round_ % 2:
                _ok(pg_url, "recover")  # what ExecStartPre does, beside the live siblings
            workers[n] = worker()
            round_ += 1
    finally:
        for w in workers:
            _kill(w)
    assert orphaned > 0, "no kill left a lease behind: the test proved nothing"

    time.sleep(1.1)  # every lease of the killed workers has expired
    _ok(pg_url, "recover")
    _ok(pg_url, "run-until-idle", "--app", APP, "--kinds", "work", "--wait-retries", "60", log=log)
    _ok(pg_url, "fsck")
    _assert_all_completed_by_a_logged_run(pg_url, ids, _runs([log]))
    with make_spool(pg_url) as spool:
        # The killed workers' leases were taken back (by a sweep or recover), not waited out
        # by luck: some job carries a rescue.
        assert any(j.rescues > 0 for j in spool.jobs(state="completed"))


_STALLER = """
import sys
from jobspool import Spool
from jobspool.errors import LeaseLost
with Spool(sys.argv[1]) as spool:
    (lease,) = spool.claim(owner="A", lease_seconds=0.5)
    print("claimed", lease.job_id, lease.token, lease.expires_at, flush=True)
    sys.stdin.readline()  # stalled (GC, SIGSTOP, a slow disk) until the test says go
    try:
        spool.complete(lease, {"by": "A", "token": lease.token})
        print("completed", flush=True)
    except LeaseLost as exc:
        print("lease-lost", exc.job_id, exc.token, flush=True)
"""


def test_a_late_completion_after_a_stall_is_refused_and_the_result_stays_the_rescuers(
        pg_url: str) -> None:
    _enqueue(pg_url, 1, job_ids=["j"])
    a = subprocess.Popen([sys.executable, "-c", _STALLER, pg_url], cwd=REPO, env=cli_env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert a.stdout is not None and a.stdin is not None
        word, job_id, token, expires_at = a.stdout.readline().decode().split()
        assert (word, job_id) == ("claimed", "j")
        with make_spool(pg_url) as b:
            (lease,) = wait_until(lambda: b.claim(owner="B"), what="A's lease to expire")
            assert lease.job_id == "j" and lease.token > int(token)
            assert time.time() >= float(expires_at)
            b.complete(lease, {"by": "B", "token": lease.token})
            a.stdin.write(b"go\n")
            a.stdin.flush()
            rc, out, err = _finish(a, timeout=60)
            assert rc == 0, err
            assert out.split() == ["lease-lost", "j", token]
            job = b.get("j")
        assert job.state is JobState.COMPLETED
        assert job.result == {"by": "B", "token": lease.token}
        assert job.attempts == 2
    finally:
        _kill(a)


# ---------------------------------------------------------------- the server goes away


def _terminate_other_sessions(url: str) -> int:
    """End every other client session of the database (an operator's or a proxy's doing)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                            "datname = current_database() AND pid <> pg_backend_pid() AND "
                            "backend_type = 'client backend'").fetchall()
    return len(rows)


@pytest.mark.parametrize("outage", ["restart", "crash", "connections killed"])
def test_a_worker_drains_every_job_exactly_once_across_a_server_outage(
        pg_server: PgServer, pg_url: str, tmp_path: Path, outage: str) -> None:
    log = tmp_path / "handled.log"
    ids = _enqueue(pg_url, 1000, kind="slow", payload={"sleep": 0.02, "log": str(log)})
    proc = start_jobspool("run-until-idle", "--app", APP, "--json", "--concurrency", "4",
                          "--batch-size", "10", root=pg_url)
    try:
        done_before = wait_until(lambda: _completed(pg_url) >= 100 and _completed(pg_url),
                                 timeout=120, what="the worker to get going")
        if outage == "restart":
            pg_server.restart()  # pg_ctl restart -m fast: every session is terminated
        elif outage == "connections killed":
            assert _terminate_other_sessions(pg_server.url) > 0
        else:
            pg_server.kill()  # -m immediate: a crash, then crash recovery on start
            time.sleep(1.0)
            pg_server.start_again()
        rc, out, err = _finish(proc)
    finally:
        _kill(proc)
    assert done_before < len(ids), "the worker finished before the outage: it proved nothing"
    assert rc == 0 and "Traceback" not in err, err
    runs = _runs([log])
    assert Counter(job_id for job_id, _ in runs) == Counter(dict.fromkeys(ids, 1))
    _assert_all_completed_by_a_logged_run(pg_url, ids, runs)
    with make_spool(pg_url) as spool:
        assert {j.attempts for j in spool.jobs()} == {1}
    report = orjson.loads(out)
    # Each job settled once by this process (a completion whose acknowledgement the outage
    # lost may be reported as a lost lease; the job is completed all the same, see above).
    assert report["completed"] + report["lease_lost"] == len(ids)


def test_a_long_job_keeps_its_lease_by_heartbeat_across_a_server_restart(
        pg_server: PgServer, pg_url: str, tmp_path: Path) -> None:
    log = tmp_path / "handled.log"
    (job_id,) = _enqueue(pg_url, 1, kind="slow", payload={"sleep": 5.0, "log": str(log)})
    proc = start_jobspool("run-until-idle", "--app", APP, "--json", "--lease-seconds", "3",
                          root=pg_url)
    try:
        def leased() -> bool:
            with make_spool(pg_url) as spool:
                return spool.get(job_id).state is JobState.LEASED
        wait_until(leased, timeout=60, what="the handler to start")
        pg_server.restart()  # mid-run; the lease (3 s) outlives the handler (5 s) only by heartbeats
        rc, out, err = _finish(proc)
    finally:
        _kill(proc)
    assert rc == 0 and "Traceback" not in err, err
    with make_spool(pg_url) as spool:
        job = spool.get(job_id)
    assert (job.state, job.attempts, job.rescues) == (JobState.COMPLETED, 1, 0)
    assert [line.split()[0] for line in log.read_text().splitlines()] == [job_id]
    assert orjson.loads(out)["completed"] == 1


@pytest.mark.parametrize("command", [("run-until-idle",), ("worker", "--processes", "2")],
                         ids=["run-until-idle", "worker-pool"])
def test_sigterm_stops_a_worker_whose_database_is_down(pg_server: PgServer, pg_url: str,
                                                       tmp_path: Path,
                                                       command: tuple[str, ...]) -> None:
    """The pool exited 0 with leases its children could not give back."""
    ids, code, text = _database_lost_mid_run(
        pg_server, pg_url, [*command, "--grace", "5"], sigterm_after=1.0, guard=60,
        hung="SIGTERM did not stop run-until-idle while its database was down")
    assert "Traceback" not in text
    # Leases it could not give back: not a clean stop (exit 2), and it says why.
    assert code == 2, text
    assert "could not be given back" in text
    _nothing_lost(pg_url, ids)


# ---------------------------------------------------------------- the CLI with --root URL


def _json(url: str, *args: str, log: Path | None = None) -> Any:
    return orjson.loads(_ok(url, *args, "--json", log=log))


def test_the_cli_end_to_end(store_root: str | Path, tmp_path: Path) -> None:
    root = str(store_root)
    assert _json(root, "init")["created"] is True
    assert _json(root, "init")["created"] is False  # safe to re-run
    assert _json(root, "enqueue", "work", '{"n": 1}', "--id", "w1")["state"] == "ready"
    _json(root, "enqueue", "poison", "--id", "p1")
    _json(root, "enqueue", "work", "--id", "w2", "--delay", "3600")
    counts = _json(root, "stats")["counts"]
    assert (counts["ready"], counts["retryable"], counts["completed"]) == (2, 1, 0)
    assert [j["id"] for j in _json(root, "list")] == ["p1", "w1", "w2"]
    assert [j["id"] for j in _json(root, "list", "--state", "ready", "--kind", "work")] == ["w1"]
    shown = _json(root, "show", "w1")
    assert (shown["state"], shown["payload"]) == ("ready", {"n": 1})

    log = tmp_path / "handled.log"
    report = _json(root, "run-until-idle", "--app", APP, log=log)
    assert (report["completed"], report["dead_lettered"]) == (1, 1)
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["w1"]
    assert _json(root, "show", "w1")["state"] == "completed"
    assert _json(root, "show", "p1")["state"] == "dead_letter"
    assert _json(root, "requeue", "p1")["state"] == "ready"
    assert _json(root, "cancel", "p1")["state"] == "canceled"
    pruned = _json(root, "prune", "--keep", "0")
    assert (pruned["completed"], pruned["canceled"]) == (["w1"], ["p1"])
    assert [j["id"] for j in _json(root, "list")] == ["w2"]
    _ok(root, "fsck")
    # JOBSPOOL_ROOT takes the URL (or directory) as --root does.
    env_run = run_jobspool("list", "--json", env={"JOBSPOOL_ROOT": root})
    assert env_run.returncode == 0, env_run.stderr
    assert [j["id"] for j in orjson.loads(env_run.stdout)] == ["w2"]
    rc, _, err = _finish(start_jobspool("show", "w1", root=root))
    assert rc == 1 and err.strip().startswith("jobspool: error:") and "w1" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _assert_one_line_unreachable(url: str, *args: str) -> None:
    rc, _, err = _finish(start_jobspool(*args, root=url), timeout=120)
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)  # DESIGN §8: the spool cannot be used
    assert len(lines) == 1 and lines[0].startswith("jobspool: error:"), err
    assert "Traceback" not in err and "hunter2" not in err  # the password is never shown


@pytest.mark.parametrize("args", [("stats",), ("enqueue", "work", "{}"), ("list",),
                                  ("run-until-idle", "--app", APP), ("init",)], ids=" ".join)
def test_an_unreachable_database_is_a_one_line_error(args: tuple[str, ...]) -> None:
    _assert_one_line_unreachable(
        f"postgresql://postgres:hunter2@127.0.0.1:{_free_port()}/postgres", *args)


def test_a_server_that_is_down_is_a_one_line_error_and_nothing_more(pg_server: PgServer,
                                                                    pg_url: str) -> None:
    _ok(pg_url, "init")
    pg_server.kill()
    try:
        _assert_one_line_unreachable(pg_url, "stats")
        _assert_one_line_unreachable(pg_url, "enqueue", "work", "{}")
    finally:
        pg_server.start_again()
    assert _json(pg_url, "stats")["counts"]["ready"] == 0


def test_a_producer_needs_no_writable_home_a_worker_says_it_does(pg_url: str) -> None:
    """This machine's directory for the spool (metrics, progress, the default projection)
    is written by workers only: an enqueue from a container with a read-only $HOME was
    refused for it. A worker still is, in one line naming the directory."""
    make_spool(pg_url).close()
    env = {"HOME": "/proc/nohome", "JOBSPOOL_STATE_DIR": None, "XDG_STATE_HOME": None}
    made = run_jobspool("enqueue", "work", "{}", root=pg_url, env=env)
    assert made.returncode == 0, made.stderr
    worker = run_jobspool("run-until-idle", "--app", APP, root=pg_url, env=env)
    assert worker.returncode == 2 and "/proc/nohome" in worker.stderr, worker.stderr
    assert len(worker.stderr.strip().splitlines()) == 1 and "Traceback" not in worker.stderr


@pytest.mark.parametrize("args", [("stats",), ("list",), ("fsck",), ("health",),
                                  ("enqueue", "work", "{}")], ids=lambda a: a[0])
def test_a_database_without_the_schema_names_init_and_no_option_the_command_lacks(
        pg_url: str, args: tuple[str, ...]) -> None:
    """It suggested `--create`, which the reading commands refuse as unrecognized."""
    out = run_jobspool(*args, root=pg_url)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "jobspool init" in out.stderr and "--create" not in out.stderr


@pytest.mark.parametrize("table", ["jobspool_jobs", "jobspool_schema", "jobspool_settings"])
def test_init_over_a_foreign_table_with_our_name_says_so(pg_url: str, table: str) -> None:
    """It printed only the raw `column "state" does not exist`."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (something text)")
    out = run_jobspool("init", root=pg_url)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "not jobspool's" in out.stderr and "search_path" in out.stderr, out.stderr


def test_a_drain_gives_up_on_a_database_down_past_its_wait_for_store(
        pg_server: PgServer, pg_url: str) -> None:
    """`run-until-idle --wait-for-store N` on a database that goes away: the statements'
    own reconnect budget (30 s) ran first, so any N under 30 waited 30 s anyway."""
    ids, code, text = _database_lost_mid_run(
        pg_server, pg_url, ["run-until-idle", "--wait-for-store", "1"], guard=20,
        hung="the drain waited the statements' 30 s, not its --wait-for-store 1")
    assert code == 2, text
    assert "(--wait-for-store 1)" in text and "Traceback" not in text
    _nothing_lost(pg_url, ids)


def _database_lost_mid_run(pg_server: PgServer, pg_url: str, command: list[str], *,
                           guard: float, hung: str, sigterm_after: float | None = None
                           ) -> tuple[list[str], int, str]:
    """Run `command` over 200 slow jobs; once it got going, the database goes away and
    stays away (SIGTERM `sigterm_after` s later, when given). Waits at most `guard` s (a
    hang guard: `hung` says what hung) for it to exit: (the job ids, exit code, stderr)."""
    ids = _enqueue(pg_url, 200, kind="slow", payload={"sleep": 0.1})
    proc = start_jobspool(*command, "--app", APP, "--concurrency", "2",
                          "--lease-seconds", "2", root=pg_url)
    try:
        wait_until(lambda: _completed(pg_url) >= 4, timeout=60, what="the run to get going")
        pg_server.kill()
        if sigterm_after is not None:
            time.sleep(sigterm_after)
            proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=guard)
        except subprocess.TimeoutExpired:
            pytest.fail(hung)
    finally:
        _kill(proc)
        pg_server.start_again()
    return ids, proc.returncode, err.decode(errors="replace")


def _nothing_lost(pg_url: str, ids: list[str]) -> None:
    """What a stopped run held is up for takeover once its 2 s leases expire: a second run
    completes every job."""
    time.sleep(2.1)
    _ok(pg_url, "run-until-idle", "--app", APP, "--wait-retries", "60")
    assert _completed(pg_url) == len(ids)
