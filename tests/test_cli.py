"""The command line, through a subprocess, for every command of DESIGN §8 and its `--json`.

Each `--json` output must parse as exactly one JSON document (`orjson.loads`
of the whole of stdout). Successful commands exit 0 and print nothing on
stderr. Bad input and refusals are in test_cli_errors.py; SIGTERM to `worker`
in test_worker_signals.py; `demo` in test_demo.py.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState
from tests.cli_harness import Result, reap, run_jobspool, start_jobspool
from tests.helpers_spool import job_files
from tests.spools import make_spool
from tests.waiting import wait_until


def ok(*args: str | Path, **kwargs: Any) -> Result:
    r = run_jobspool(*args, **kwargs)
    assert r.code == 0, f"exit {r.code}: {r.err}"
    assert "Traceback" not in r.err, r.err
    return r


def ok_json(*args: str | Path, **kwargs: Any) -> Any:
    r = ok(*args, "--json", **kwargs)
    return r.json()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def spool_with_jobs(root: Path) -> Path:
    """An initialized spool (made in-process: `init` itself is tested on its own)."""
    make_spool(root).close()
    return root


# ---------------------------------------------------------------- init


def test_init_creates_the_spool_layout_and_reports_it(root: Path) -> None:
    doc = ok_json("--root", root, "init")
    assert doc["created"] is True
    assert Path(doc["root"]) == root.resolve()
    assert doc["settings"]["lease_seconds"] == 60.0
    for d in ("prepared", "ready", "leased", "retryable", "completed", "dead_letter",
              "canceled", "tmp", "quarantine"):
        assert (root / d).is_dir(), d
    assert (root / "spool.json").is_file()
    again = ok_json("--root", root, "init")
    assert again["created"] is False


def test_init_stores_settings_that_later_opens_use(root: Path) -> None:
    doc = ok_json("--root", root, "init", "--lease-seconds", "7.5", "--max-attempts", "2",
                  "--keep-terminal", "10")
    assert doc["settings"]["lease_seconds"] == 7.5
    assert doc["settings"]["max_attempts"] == 2
    assert doc["settings"]["keep_terminal"] == 10
    job = ok_json("--root", root, "enqueue", "work")
    assert job["max_attempts"] == 2
    with make_spool(root, create=False) as spool:
        assert spool.lease_seconds == 7.5


def test_init_again_with_other_settings_shows_the_kept_ones_and_says_so(root: Path) -> None:
    """Settings are fixed at creation: a second init printed the given values as if
    saved. Now the stored ones are shown, the others named as not saved (exit 0: an
    idempotent init in a deploy script must not fail)."""
    ok("--root", root, "init", "--max-attempts", "7")
    r = ok("--root", root, "init", "--max-attempts", "3", "--keep-terminal", "1000", "--json")
    doc = r.json()
    assert doc["settings"]["max_attempts"] == 7 and doc["ignored"] == {"max_attempts": 3}
    assert "max_attempts=7 (given 3)" in r.err
    assert ok_json("--root", root, "enqueue", "work")["max_attempts"] == 7


def test_init_text_output_names_the_directory(root: Path) -> None:
    r = ok("--root", root, "init")
    assert str(root.resolve()) in r.out
    assert r.err == ""


def test_json_flag_works_before_or_after_the_command_and_root_comes_from_the_env(
        root: Path) -> None:
    ok("--root", root, "init")
    a = ok("--json", "--root", root, "stats").json()
    b = ok("stats", "--root", root, "--json").json()
    c = ok("stats", "--json", env={"JOBSPOOL_ROOT": str(root)}).json()
    assert a["counts"] == b["counts"] == c["counts"]


def test_version_and_help(root: Path) -> None:
    assert ok("--version").out.startswith("jobspool ")
    helptext = ok("--help").out
    for command in ("init", "enqueue", "run-until-idle", "worker", "recover", "stats", "list",
                    "show", "cancel", "requeue", "prune", "fsck", "maintain", "demo"):
        assert command in helptext


# ---------------------------------------------------------------- enqueue


def test_enqueue_with_a_json_payload(spool_with_jobs: Path) -> None:
    job = ok_json("--root", spool_with_jobs, "enqueue", "work", '{"doc": 1, "tags": ["a"]}',
                  "--priority", "3", "--max-attempts", "4")
    assert job["kind"] == "work"
    assert job["payload"] == {"doc": 1, "tags": ["a"]}
    assert job["state"] == "ready"
    assert job["priority"] == 3
    assert job["max_attempts"] == 4
    assert job_files(spool_with_jobs) == {job["id"]: ["ready"]}


def test_enqueue_reads_the_payload_from_stdin_with_a_dash(spool_with_jobs: Path) -> None:
    payload = {"text": "from a pipe", "n": [1, 2, 3]}
    job = ok_json("--root", spool_with_jobs, "enqueue", "work", "-",
                  stdin=orjson.dumps(payload).decode() + "\n")
    assert job["payload"] == payload


def test_enqueue_without_a_payload_stores_null(spool_with_jobs: Path) -> None:
    job = ok_json("--root", spool_with_jobs, "enqueue", "work")
    assert job["payload"] is None


def test_enqueue_with_an_id_is_idempotent(spool_with_jobs: Path) -> None:
    first = ok_json("--root", spool_with_jobs, "enqueue", "work", '{"v": 1}', "--id", "doc-1.a_b")
    second = ok_json("--root", spool_with_jobs, "enqueue", "work", '{"v": 2}', "--id", "doc-1.a_b")
    assert first["id"] == second["id"] == "doc-1.a_b"
    assert second["payload"] == {"v": 1}
    assert second["revision"] == first["revision"]
    assert job_files(spool_with_jobs) == {"doc-1.a_b": ["ready"]}


def test_enqueue_with_a_delay_is_not_due_yet(spool_with_jobs: Path) -> None:
    before = time.time()
    job = ok_json("--root", spool_with_jobs, "enqueue", "work", "--delay", "3600")
    assert job["state"] == "retryable"
    assert job["run_at"] >= before + 3600
    report = ok_json("--root", spool_with_jobs, "run-until-idle", "--app", "tests.apps.simple:app")
    assert report["claimed"] == 0


def test_a_delayed_job_is_run_by_run_until_idle_waiting_for_retries(spool_with_jobs: Path) -> None:
    job = ok_json("--root", spool_with_jobs, "enqueue", "work", "--delay", "0.3")
    report = ok_json("--root", spool_with_jobs, "run-until-idle", "--app", "tests.apps.simple:app",
                     "--wait-retries", "10")
    assert report["completed"] == 1
    assert ok_json("--root", spool_with_jobs, "show", job["id"])["state"] == "completed"


def test_enqueue_text_output_is_the_id_and_state(spool_with_jobs: Path) -> None:
    r = ok("--root", spool_with_jobs, "enqueue", "work", "--id", "j1")
    assert r.out.split() == ["j1", "ready"]


@pytest.mark.parametrize(("argv", "payload"), [
    (["work", "--id", "j1", "--", '{"a": 1}'], {"a": 1}),
    (["work", "--id", "j1", "--", "-5"], -5),  # after `--`, a leading dash is the payload's
    (["work", "--", '{"a": 1}'], {"a": 1}),
    (["--id", "j1", "--", "work", "[2]"], [2]),
    (["work", "--id", "j1", "--"], None),
])
def test_enqueue_takes_its_payload_after_a_double_dash(spool_with_jobs: Path, argv: list[str],
                                                      payload: Any) -> None:
    """`--` ends the options wherever it stands (it was refused after an option)."""
    job = ok("--root", spool_with_jobs, "--json", "enqueue", *argv).json()
    assert job["payload"] == payload
    assert ok_json("--root", spool_with_jobs, "show", job["id"])["payload"] == payload


@pytest.mark.parametrize(("argv", "payload"), [
    (["work", "--id", "j1", "-1"], -1),
    (["work", "-1e5"], -1e5),
    (["work", "--id", "j1", "-1e5"], -1e5),
    (["work", "-0.5", "--id", "j1"], -0.5),
    (["work", "--priority", "2", "-2E-3"], -2e-3),
])
def test_enqueue_takes_a_negative_number_as_its_payload_wherever_it_stands(
        spool_with_jobs: Path, argv: list[str], payload: Any) -> None:
    """A JSON number starting with '-' is not an option (it was refused after one, and
    `-1e5` anywhere)."""
    job = ok("--root", spool_with_jobs, "--json", "enqueue", *argv).json()
    assert job["payload"] == payload


def test_enqueue_still_refuses_a_dash_argument_that_is_not_a_number(
        spool_with_jobs: Path) -> None:
    for extra in ("-x", "-1e", "-01"):
        r = run_jobspool("--root", spool_with_jobs, "enqueue", "work", "--id", "j1", extra)
        assert r.code == 1 and f"unrecognized arguments: {extra}" in r.err, r.err
    assert job_files(spool_with_jobs).get("j1") is None


def test_enqueue_refuses_a_missing_spool_unless_told_to_create_it(root: Path) -> None:
    r = run_jobspool("--root", root, "enqueue", "work")
    assert r.code == 2 and "jobspool init" in r.err and len(r.err.splitlines()) == 1
    assert not root.exists()  # a mistyped root is never silently a new empty spool
    ok_json("--root", root, "enqueue", "work", "--create")
    assert (root / "spool.json").is_file()


# ---------------------------------------------------------------- run-until-idle


def test_run_until_idle_drains_and_reports_as_one_json_document(
        spool_with_jobs: Path, tmp_path: Path) -> None:
    root = spool_with_jobs
    log = tmp_path / "log"
    with make_spool(root) as spool:
        spool.enqueue_many("work", [{"i": i} for i in range(5)])
        spool.enqueue("poison")
        spool.enqueue("nobody_handles_this")
    report = ok_json("--root", root, "run-until-idle", "--app", "tests.apps.simple:app",
                     "--concurrency", "2", env={"JOBSPOOL_TEST_LOG": str(log)})
    assert report["claimed"] == 6
    assert report["completed"] == 5
    assert report["dead_lettered"] == 1
    assert report["unhandled"] == {"nobody_handles_this": 1}
    for key in ("retried", "lease_lost", "released", "duration", "rate"):
        assert key in report
    assert len(log.read_text().splitlines()) == 5
    counts = ok_json("--root", root, "stats")["counts"]
    assert (counts["completed"], counts["dead_letter"], counts["ready"]) == (5, 1, 1)


def test_run_until_idle_json_keeps_stdout_one_document_when_handlers_print(
        spool_with_jobs: Path) -> None:
    """What handlers print goes to stderr with `--json` (it was mixed into stdout, and the
    document no longer parsed); with `--log-format json` too, the summary event is still
    written to stderr, as the README says: always."""
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue("chatty", {"n": 7})
    r = ok("--root", root, "run-until-idle", "--app", "tests.apps.audit11:app", "--json",
           "--log-format", "json", "--no-maintenance")
    assert r.json()["completed"] == 1
    assert "7:1999 " in r.err and "7:1999 " not in r.out
    events = [orjson.loads(line) for line in r.err.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events if e.get("event") == "summary"] == ["summary"]


@pytest.mark.parametrize("command", [["run-until-idle"], ["worker"],
                                     ["worker", "--processes", "2"]])
def test_json_stdout_stays_one_document_when_handlers_write_around_sys_stdout(
        spool_with_jobs: Path, command: list[str]) -> None:
    """A handler's child process and `os.write(1, ...)` go to file descriptor 1, not through
    `sys.stdout`: with `--json` they land on stderr too (in-process they broke the
    document)."""
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue("shellout")
    args = [*command, "--app", "tests.apps.audit11:app", "--json", "--no-maintenance"]
    if command[0] == "worker":
        proc = start_jobspool(*args, root=root)
        try:
            wait_until(lambda: list((root / "completed").iterdir()), 60,
                       "the job to be completed", proc=proc)
            proc.send_signal(signal.SIGTERM)
            raw_out, raw_err = proc.communicate(timeout=60)
        finally:
            reap(proc)
        assert proc.returncode == 0, raw_err.decode()
        out, err = raw_out.decode(), raw_err.decode()
    else:
        r = ok("--root", root, *args)
        out, err = r.out, r.err
    assert orjson.loads(out)["completed"] == 1
    assert "child wrote this" in err and "fd1 wrote this" in err


def test_run_until_idle_text_summary_names_unhandled_kinds_and_draws_no_bar_on_a_pipe(
        spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work")
    ok("--root", root, "enqueue", "orphan")
    r = ok("--root", root, "run-until-idle", "--app", "tests.apps.simple:app")
    assert "completed 1" in r.out
    assert "orphan" in r.out
    assert "\r" not in r.out  # no progress bar when stdout is not a terminal


def test_run_until_idle_max_jobs_and_kinds(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue_many("work", [{} for _ in range(5)])
        spool.enqueue("awork")
    r1 = ok_json("--root", root, "run-until-idle", "--app", "tests.apps.simple:app",
                 "--kinds", "work", "--max-jobs", "2", "--batch-size", "1")
    assert r1["claimed"] == 2
    r2 = ok_json("--root", root, "run-until-idle", "--app", "tests.apps.simple:app",
                 "--kinds", "work")
    assert r2["claimed"] == 3
    assert r2["unhandled"] == {"awork": 1}
    r3 = ok_json("--root", root, "run-until-idle", "--app", "tests.apps.simple:app")
    assert r3["completed"] == 1


def test_run_until_idle_says_max_jobs_left_the_rest(spool_with_jobs: Path) -> None:
    # Found probing the README: the due jobs --max-jobs left were said to have "come due
    # after the run's last claim", with --wait-retries offered, which does nothing for them.
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue_many("work", [{} for _ in range(5)])
        spool.enqueue_many("work", [{}, {}], delay=600)  # not due: not the limit's doing
    r = ok("--root", root, "run-until-idle", "--app", "tests.apps.simple:app",
           "--max-jobs", "1", "--batch-size", "1")
    assert ("left 4 due job(s) of its kinds: --max-jobs 1 reached; run again for more "
            "(2 more not due yet)") in r.out, r.out
    assert "came due after" not in r.out and "--wait-retries" not in r.out, r.out


def test_run_until_idle_stopped_by_a_signal_says_it_left_the_rest(spool_with_jobs: Path) -> None:
    import signal
    import subprocess

    from tests.cli_harness import start_jobspool
    from tests.waiting import wait_until

    root = spool_with_jobs
    started = root.parent / "started"
    with make_spool(root) as spool:
        spool.enqueue_many("slow", [{"sleep": 1.0, "started": str(started)} for _ in range(4)])
        spool.enqueue("slow", {}, delay=3600)  # not due: not left by the stop
    proc = start_jobspool("run-until-idle", "--app", "tests.apps.simple:app",
                          "--concurrency", "1", "--batch-size", "1", root=root, text=True)
    try:
        wait_until(started.exists, 60, "a handler to start", proc=proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert ("left 3 due job(s) of its kinds: the run was stopped; run again for the rest "
            "(1 more not due yet)") in out, (out, err)
    assert "came due after" not in out, out


def test_run_until_idle_wait_retries_finishes_flaky_jobs(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    job = ok_json("--root", root, "enqueue", "flaky")
    report = ok_json("--root", root, "run-until-idle", "--app", "tests.apps.simple:app",
                     "--wait-retries", "10")
    assert (report["completed"], report["retried"]) == (1, 2)
    shown = ok_json("--root", root, "show", job["id"])
    assert shown["state"] == "completed"
    assert shown["attempts"] == 3


def test_run_until_idle_names_the_jobs_of_its_kinds_it_left_not_due_yet(
        spool_with_jobs: Path) -> None:
    """"Idle" with jobs still to run later (a retry backing off, such as a job rescued
    from a killed worker, or a delayed job) says so: a script ran once and took the queue
    for drained."""
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work", "--delay", "30")
    ok("--root", root, "enqueue", "work", "--delay", "60")
    ok("--root", root, "enqueue", "orphan", "--delay", "5")  # no handler: not ours to wait for
    r = ok("--root", root, "run-until-idle", "--app", "tests.apps.simple:app")
    assert "left 2 job(s) not due yet" in r.out
    assert "--wait-retries" in r.out
    doc = ok_json("--root", root, "run-until-idle", "--app", "tests.apps.simple:app")
    assert doc["waiting"] == 2
    assert 0 < doc["next_due_in"] <= 30
    ok("--root", root, "run-until-idle", "--app", "tests.apps.simple:app")
    with make_spool(root) as spool:
        assert spool.stats().counts["retryable"] == 3  # nothing ran early


def test_run_until_idle_says_nothing_of_waiting_jobs_when_none_are_left(
        spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work")
    r = ok("--root", root, "run-until-idle", "--app", "tests.apps.simple:app")
    assert "completed 1" in r.out and "not due yet" not in r.out
    assert ok_json("--root", root, "run-until-idle", "--app", "tests.apps.simple:app"
                   )["waiting"] == 0


@pytest.mark.parametrize("target", ["tests.apps.plain:handlers", "tests.apps.plain:registry"])
def test_run_until_idle_accepts_a_plain_mapping_or_an_object_with_handlers(
        spool_with_jobs: Path, target: str) -> None:
    root = spool_with_jobs
    job = ok_json("--root", root, "enqueue", "echo", '{"x": 1}')
    ok_json("--root", root, "run-until-idle", "--app", target)
    assert ok_json("--root", root, "show", job["id"])["result"] == {"x": 1}


def test_run_until_idle_finds_an_app_in_the_working_directory(tmp_path: Path) -> None:
    """Like uvicorn: `--app tasks:app` imports ./tasks.py without PYTHONPATH tricks."""
    root = tmp_path / "spool"
    (tmp_path / "mytasks.py").write_text(
        "def shout(job, ctx):\n    return job.payload.upper()\n\nhandlers = {'shout': shout}\n")
    ok("--root", root, "enqueue", "shout", '"hi"', "--create")
    done = run_jobspool("run-until-idle", "--app", "mytasks:handlers", "--json", root=root,
                        cwd=tmp_path, timeout=60)
    assert done.code == 0, done.err
    assert done.json()["completed"] == 1


def _run_on_a_tty(args: list[str], timeout: float = 60.0) -> str:
    """Run the CLI with stdout on a pseudo-terminal and return what it printed."""
    master, slave = pty.openpty()
    proc = start_jobspool(*args, stdout=slave)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    poller = select.poll()  # not select: it refuses descriptors past 1023 (cli_harness.py)
    poller.register(master, select.POLLIN | select.POLLHUP)
    try:
        while time.monotonic() < deadline:
            if poller.poll(100):
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        reap(proc)
        os.close(master)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.returncode == 0, err
    return b"".join(chunks).decode(errors="replace")


def test_run_until_idle_draws_a_progress_bar_on_a_terminal(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue_many("slow", [{"sleep": 0.05} for _ in range(30)])
    out = _run_on_a_tty(["--root", str(root), "run-until-idle", "--app",
                         "tests.apps.simple:app", "--batch-size", "5"])
    assert "\r[" in out  # redrawn in place
    assert "jobs/s" in out
    assert "/30" in out
    assert "completed 30" in out  # and the summary after it


def test_the_progress_bar_total_counts_only_jobs_this_worker_can_run(spool_with_jobs: Path) -> None:
    """Due jobs of kinds the app lacks are left alone; the bar's total must not count
    them, and its last frame must show the end state (however fast the last batch was)."""
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue_many("work", [None] * 40)
        spool.enqueue_many("orphan", [None] * 5)
    out = _run_on_a_tty(["--root", str(root), "run-until-idle", "--app",
                         "tests.apps.simple:app", "--batch-size", "1"])
    assert "/45" not in out, out
    frames = [f for f in out.split("\r") if f.startswith("[")]
    assert frames, out
    assert "40/40" in frames[-1], frames[-1]


def test_run_until_idle_json_on_a_terminal_is_still_one_document(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work")
    out = _run_on_a_tty(["--root", str(root), "run-until-idle", "--app",
                         "tests.apps.simple:app", "--json"])
    assert orjson.loads(out.replace("\r\n", "\n"))["completed"] == 1


# ---------------------------------------------------------------- worker


def test_worker_serves_until_sigterm_and_prints_a_json_report(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work")
    proc = start_jobspool("worker", "--app", "tests.apps.simple:app", "--json", root=root)
    try:
        wait_until(lambda: list((root / "completed").iterdir()), 30, "the job to be completed",
                   proc=proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        reap(proc)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err
    report = orjson.loads(out)
    assert report["completed"] == 1


# ---------------------------------------------------------------- recover


def test_recover_reclaims_a_dead_workers_lease_and_reports_counts(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    with make_spool(root) as spool:
        job = spool.enqueue("work")
        spool.claim(lease_seconds=0.05)  # and then the "worker" dies
    time.sleep(0.1)
    doc = ok_json("--root", root, "recover")
    assert doc["leases_reclaimed"] == [job.id]
    assert doc["changed"] is True
    shown = ok_json("--root", root, "show", job.id)
    assert shown["state"] in ("retryable", "ready")
    assert not list((root / "leased").iterdir())
    # Idempotent: a second run finds nothing to do.
    again = ok_json("--root", root, "recover", "--app", "tests.apps.simple:app")
    assert again["leases_reclaimed"] == []
    assert again["changed"] is False
    assert ok("--root", root, "recover").out.strip() != ""


# ---------------------------------------------------------------- stats, list, show


def test_stats_counts_every_state_and_by_kind(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue_many("a", [1, 2])
        spool.enqueue("b")
        (lease,) = spool.claim(kinds=["b"])
        spool.complete(lease, "done")
    doc = ok_json("--root", root, "stats", "--by-kind")
    assert doc["counts"]["ready"] == 2
    assert doc["counts"]["completed"] == 1
    assert set(doc["counts"]) == {s.value for s in JobState}
    assert doc["by_kind"]["a"]["ready"] == 2
    assert doc["by_kind"]["b"]["completed"] == 1
    text = ok("--root", root, "stats").out
    assert "ready" in text and "completed" in text


def test_stats_prometheus_output(spool_with_jobs: Path) -> None:
    ok("--root", spool_with_jobs, "enqueue", "work")
    out = ok("--root", spool_with_jobs, "stats", "--prometheus").out
    assert "# TYPE" in out
    assert "jobspool" in out


def test_list_filters_by_state_and_kind_and_limits(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    with make_spool(root) as spool:
        a = [j.id for j in spool.enqueue_many("a", [1, 2, 3])]
        b = spool.enqueue("b").id
        spool.cancel(a[0])
    everything = ok_json("--root", root, "list")
    assert sorted(j["id"] for j in everything) == sorted([*a, b])
    ready_a = ok_json("--root", root, "list", "--state", "ready", "--kind", "a")
    assert [j["id"] for j in ready_a] == a[1:]  # FIFO order
    assert [j["id"] for j in ok_json("--root", root, "list", "--state", "canceled")] == [a[0]]
    assert len(ok_json("--root", root, "list", "--limit", "2")) == 2
    assert ok_json("--root", root, "list", "--kind", "nothing") == []
    text = ok("--root", root, "list", "--kind", "b").out
    assert b in text


def test_show_prints_every_field_of_one_job(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    job = ok_json("--root", root, "enqueue", "work", '{"k": "v"}', "--id", "show-me")
    shown = ok_json("--root", root, "show", "show-me")
    assert shown == job
    for field in ("id", "kind", "payload", "state", "priority", "attempts", "max_attempts",
                  "revision", "created_at", "updated_at", "run_at", "lease", "last_error",
                  "result"):
        assert field in shown
    text = ok("--root", root, "show", "show-me").out
    assert "show-me" in text and "work" in text


# ---------------------------------------------------------------- cancel, requeue


def test_cancel_a_ready_job(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work", "--id", "c1")
    doc = ok_json("--root", root, "cancel", "c1")
    assert doc["state"] == "canceled"
    assert job_files(root) == {"c1": ["canceled"]}
    report = ok_json("--root", root, "run-until-idle", "--app", "tests.apps.simple:app")
    assert report["claimed"] == 0


def test_requeue_one_dead_letter_and_all_of_them(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue_many("poison", [None] * 3, job_ids=["p0", "p1", "p2"])
    ok("--root", root, "run-until-idle", "--app", "tests.apps.simple:app")
    assert ok_json("--root", root, "stats")["counts"]["dead_letter"] == 3
    one = ok_json("--root", root, "requeue", "p0")
    assert one["state"] == "ready"
    assert one["attempts"] == 0
    rest = ok_json("--root", root, "requeue", "--all-dead")
    assert sorted(rest["requeued"]) == ["p1", "p2"] and rest["count"] == 2  # as the filters'
    counts = ok_json("--root", root, "stats")["counts"]
    assert (counts["ready"], counts["dead_letter"]) == (3, 0)
    assert ok_json("--root", root, "requeue", "--all-dead")["requeued"] == []


def test_requeue_a_canceled_job(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work", "--id", "c1")
    ok("--root", root, "cancel", "c1")
    assert ok_json("--root", root, "requeue", "c1")["state"] == "ready"


# ---------------------------------------------------------------- prune, fsck, maintain, health


def test_prune_removes_old_terminal_jobs(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    with make_spool(root) as spool:
        spool.enqueue_many("work", [None] * 4)
        for lease in spool.claim(limit=4):
            spool.complete(lease)
        spool.enqueue("work", job_id="still-ready")
    doc = ok_json("--root", root, "prune", "--keep", "1")
    assert doc["pruned"] == 3
    left = job_files(root)
    assert len(left) == 2
    assert len([i for i, where in left.items() if where == ["completed"]]) == 1
    assert left["still-ready"] == ["ready"]
    assert ok("--root", root, "prune").code == 0


def test_fsck_on_a_healthy_spool(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work")
    doc = ok_json("--root", root, "fsck")
    assert doc["ok"] is True
    assert doc["problems"] == []
    assert "consistent" in ok("--root", root, "fsck").out


def test_maintain_with_no_tables_reports_structured_json(spool_with_jobs: Path) -> None:
    doc = ok_json("--root", spool_with_jobs, "maintain", timeout=120)
    assert isinstance(doc, dict)
    assert doc.get("tables") == [], f"maintain --json should list per-table outcomes: {doc}"


def test_health_ok_then_degraded_by_a_dead_letter(spool_with_jobs: Path) -> None:
    root = spool_with_jobs
    ok("--root", root, "enqueue", "work")
    doc = ok_json("--root", root, "health")
    assert doc["status"] == "ok" and doc["ok"] is True
    with make_spool(root) as spool:
        spool.enqueue("poison")
        (lease,) = spool.claim(kinds=["poison"])
        spool.fail(lease, "poison pill", retryable=False)
    bad = run_jobspool("--root", root, "health", "--json")
    assert bad.code == 2
    doc = bad.json()
    assert doc["status"] == "degraded"
    assert [r["code"] for r in doc["reasons"]] == ["dead_letters"]


def test_every_command_that_prints_one_job_prints_the_same_document(tmp_path: Path) -> None:
    # Found in a CLI probe: cancel, requeue and quarantine restore printed the bare job,
    # without the `status` and `*_iso` fields that enqueue, show and list add.
    from tests.cli_harness import run_cli

    root = tmp_path / "spool"
    make_spool(root).close()

    def doc(*args: str) -> dict[str, Any]:
        code, out, err = run_cli(*args, "--json", root=root)
        assert code == 0, err
        parsed = orjson.loads(out)
        return parsed["job"] if "restored" in parsed else parsed

    shown = doc("enqueue", "k", "{}", "--id", "j1")
    docs = [shown, doc("show", "j1"), doc("cancel", "j1"), doc("requeue", "j1")]
    (root / "ready" / "j1.json").rename(root / "ready" / "moved.json")  # a misnamed file
    assert orjson.loads(run_cli("recover", "--json", root=root).out)["quarantined"]
    name = orjson.loads(run_cli("quarantine", "list", "--json", root=root).out)["files"][0]["name"]
    docs.append(doc("quarantine", "restore", name))
    for d in docs:
        assert set(d) == set(shown), sorted(set(d) ^ set(shown))
        assert d["status"] == d["state"] and d["updated_at_iso"].endswith("Z")


def test_a_job_of_its_kinds_that_came_due_after_the_last_claim_is_reported_left(
        tmp_path: Path) -> None:
    """Found by a parity probe: a retry with a few ms of backoff came due between the
    run's last (empty) claim and its report, on PostgreSQL every time: counted neither as
    due nor as not due yet, so the run said one job was left when two were."""
    from jobspool import Worker

    with make_spool(tmp_path / "s") as spool:
        worker = Worker(spool, handlers={"work": lambda job, ctx: None})
        spool.enqueue("work", job_id="due-now")  # as if it came due after the last claim
        spool.enqueue("work", job_id="later", delay=60)
        unhandled, waiting, next_due_in, due = worker._left_behind()  # noqa: SLF001
    assert unhandled == {} and waiting == 2 and next_due_in == 0.0 and due == 1


def test_maintain_names_a_mistyped_table_instead_of_passing_it_as_nothing_to_do(
        spool_with_jobs: Path) -> None:
    import lancedb

    root = spool_with_jobs
    before = run_jobspool("--root", root, "maintain", "--tables", "notes", "--json",
                          timeout=120)
    assert before.code == 0, before.err  # no table yet: a cron line before the first job
    lancedb.connect(str(root / "index")).create_table("notes", data=[{"id": "a", "v": 1}])
    typo = run_jobspool("--root", root, "maintain", "--tables", "ntoes", "--json",
                        timeout=120)
    assert typo.code == 1
    assert "'ntoes'" in typo.err and "notes" in typo.err and "Traceback" not in typo.err
    assert orjson.loads(typo.out)["ok"] is False  # --json: the error document, not the report
    # With a good name beside the typo, nothing is done: checked after the work, "notes"
    # was compacted and its report thrown away behind the error (a projection probe).
    table = lancedb.connect(str(root / "index")).open_table("notes")
    for n in range(3):  # fragments for compaction to merge: work that shows in the version
        table.add([{"id": f"b{n}", "v": n}])
    version = lancedb.connect(str(root / "index")).open_table("notes").version
    both = run_jobspool("--root", root, "maintain", "--tables", "notes,ntoes", timeout=120)
    assert both.code == 1 and "'ntoes'" in both.err
    assert lancedb.connect(str(root / "index")).open_table("notes").version == version
    assert run_jobspool("--root", root, "maintain", "--tables", "notes",
                        timeout=120).code == 0
