"""CLI polish: help with units, no silent choice between output formats, JSON logs on every
stderr line, a mistyped root refused, bulk cancel/requeue, `LanceProjection` at the top."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from jobspool import JobState
from jobspool.cli import build_parser
from tests.cli_harness import run_cli, run_jobspool
from tests.helpers_spool import FakeClock
from tests.spools import make_spool
from tests.subproc import REPO, cli_env


def _subparsers(parser: argparse.ArgumentParser, path: str = "jobspool"
                ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, f"{path} {name}")


# ---------------------------------------------------------------- help


def test_every_option_of_every_command_has_help_text() -> None:
    missing = []
    for path, parser in _subparsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_options_taking_durations_say_seconds_and_priority_says_which_way_runs_first() -> None:
    unitless = []
    for path, parser in _subparsers(build_parser()):
        for action in parser._actions:
            if action.metavar == "SECONDS" and "SECONDS" not in (action.help or "") \
                    and "seconds" not in (action.help or ""):
                unitless.append(f"{path} {action.option_strings}")
    assert unitless == []
    enqueue = dict(_subparsers(build_parser()))["jobspool enqueue"]
    helps = {o: a.help or "" for a in enqueue._actions for o in a.option_strings}
    assert "seconds" in helps["--delay"].lower()
    assert "lower runs first" in helps["--priority"]


# ---------------------------------------------------------------- output formats


def test_stats_refuses_prometheus_and_json_together_as_a_usage_error(
        tmp_path: Path) -> None:
    make_spool(tmp_path / "s").close()
    code, out, err = run_cli("--root", tmp_path / "s", "stats", "--prometheus", "--json")
    assert code == 1
    assert err.count("\n") == 1 and "--prometheus" in err and "--json" in err
    assert "jobspool_jobs" not in out
    assert orjson.loads(out)["ok"] is False


def test_with_json_logs_every_stderr_line_is_json_with_start_jobs_and_summary(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        ids = [spool.enqueue("echo", {"n": i}).id for i in range(3)]
    proc = run_jobspool("run-until-idle", "--app", "tests.apps.plain:handlers",
                        "--log-format", "json", "--log-level", "info", root=root)
    assert proc.returncode == 0, proc.stderr
    lines = [orjson.loads(line) for line in proc.stderr.splitlines()]  # each is JSON
    assert lines and all(isinstance(d, dict) and d["level"] and d["msg"] for d in lines)
    assert lines[0]["event"] == "start" and lines[0]["command"] == "run-until-idle"
    assert lines[0]["app"] == "tests.apps.plain:handlers"
    per_job = [d["job_id"] for d in lines if d.get("state") == "completed"]
    assert sorted(per_job) == sorted(ids)
    assert lines[-1]["event"] == "summary" and lines[-1]["summary"]["completed"] == 3
    assert proc.stdout == ""  # the summary went to stderr as JSON, not as text


def test_with_json_logs_a_refused_command_writes_its_error_as_json(tmp_path: Path) -> None:
    proc = run_jobspool("worker", "--app", "tests.apps.plain:handlers", "--log-format", "json",
                        root=tmp_path / "typo")
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    doc = orjson.loads(line)
    assert doc["level"] == "error" and doc["exit"] == 2 and "jobspool init" in doc["msg"]


def test_lance_projection_is_importable_from_the_package_without_loading_it_eagerly() -> None:
    import jobspool
    from jobspool.projection.lance import LanceProjection

    assert jobspool.LanceProjection is LanceProjection
    assert "LanceProjection" in jobspool.__all__
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, jobspool; print('jobspool.projection.lance' in "
         "sys.modules)"], cwd=REPO, env=cli_env(), capture_output=True, timeout=60, check=True)
    assert probe.stdout.strip() == b"False"


# ---------------------------------------------------------------- a mistyped root


WRITERS = (["enqueue", "mail"], ["worker", "--app", "tests.apps.plain:handlers"],
           ["run-until-idle", "--app", "tests.apps.plain:handlers"], ["recover"],
           ["cancel", "some-id"], ["cancel", "--kind", "mail"], ["requeue", "--all-dead"],
           ["prune"], ["maintain"], ["quarantine", "purge"])
READERS = (["stats"], ["stats", "--prometheus"], ["list"], ["show", "some-id"], ["health"],
           ["fsck"], ["quarantine", "list"])


@pytest.mark.parametrize("command", [*WRITERS, *READERS], ids=lambda c: " ".join(c))
def test_a_root_that_is_not_a_spool_is_refused_with_one_line_naming_init(
        command: list[str], tmp_path: Path) -> None:
    typo = tmp_path / "spoool"
    code, _, err = run_cli("--root", typo, *command)
    assert code == 2
    assert err.count("\n") == 1 and "jobspool init" in err, err
    assert not typo.exists()
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    code, _, err = run_cli("--root", home, *command)
    assert code == 2 and err.count("\n") == 1 and "jobspool init" in err, err
    assert [p.name for p in home.iterdir()] == ["notes.txt"]


def test_init_and_an_explicit_create_make_a_spool(tmp_path: Path) -> None:
    code, _, err = run_cli("--root", tmp_path / "a", "init")
    assert code == 0 and (tmp_path / "a" / "spool.json").is_file(), err
    code, out, err = run_cli("--root", tmp_path / "b", "enqueue", "mail", "--create")
    assert code == 0 and out.split()[1] == "ready", err
    code, _, err = run_cli("--root", tmp_path / "c", "recover", "--create")
    assert code == 0 and (tmp_path / "c" / "spool.json").is_file(), err


# ---------------------------------------------------------------- bulk cancel / requeue


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[tuple[Path, FakeClock]]:
    clock = FakeClock()
    root = tmp_path / "spool"
    with make_spool(root, clock=clock) as spool:
        spool.enqueue("mail", job_id="old-mail")
        spool.enqueue("report", job_id="old-report")
        clock.advance(600.0)
        spool.enqueue("mail", job_id="new-mail")
        spool.enqueue("mail", job_id="later-mail", delay=60.0)
        for kind in ("mail", "report"):
            (lease,) = spool.claim(kinds=[kind])
            spool.fail(lease, "nope", retryable=False)
    yield root, clock


def _state(root: Path, job_id: str) -> JobState:
    with make_spool(root) as spool:
        return spool.get(job_id).state


def test_cancel_by_kind_and_state_reports_a_count(
        busy: tuple[Path, FakeClock]) -> None:
    root, _ = busy
    code, out, err = run_cli("--root", root, "cancel", "--kind", "mail", "--state",
                         "retryable")
    assert code == 0 and out.strip() == "canceled 1 job(s)", err
    assert _state(root, "later-mail") is JobState.CANCELED
    assert _state(root, "new-mail") is JobState.READY
    code, out, _ = run_cli("--root", root, "cancel", "--kind", "mail", "--json")
    doc = orjson.loads(out)
    assert code == 0 and doc["count"] == 1 and doc["canceled"] == ["new-mail"]


def test_cancel_by_age_takes_only_jobs_older_than_the_bound(
        busy: tuple[Path, FakeClock]) -> None:
    root, clock = busy
    with make_spool(root, clock=clock) as spool:
        clock.advance(100.0)
        spool.enqueue("mail", job_id="fresh")
        moved = spool.cancel_matching(older_than=50.0)
    assert sorted(j.id for j in moved) == ["later-mail", "new-mail"]  # the dead ones are done
    assert _state(root, "fresh") is JobState.READY  # 0 s old: within the bound


def test_requeue_by_kind_takes_dead_letters_of_that_kind_only(
        busy: tuple[Path, FakeClock]) -> None:
    root, _ = busy
    code, out, err = run_cli("--root", root, "requeue", "--kind", "report")
    assert code == 0 and out.strip() == "requeued 1 job(s)", err
    assert _state(root, "old-report") is JobState.READY
    assert _state(root, "old-mail") is JobState.DEAD_LETTER
    run_cli("--root", root, "cancel", "new-mail")
    code, out, _ = run_cli("--root", root, "requeue", "--state", "canceled",
                       "--state", "dead_letter", "--json")
    assert code == 0 and sorted(orjson.loads(out)["requeued"]) == ["new-mail", "old-mail"]


def test_bulk_filters_are_checked_before_anything_moves(
        busy: tuple[Path, FakeClock]) -> None:
    root, _ = busy
    for args in (["cancel", "new-mail", "--kind", "mail"], ["cancel"],
                 ["cancel", "--state", "completed"], ["requeue", "--all-dead", "--kind", "mail"],
                 ["requeue", "--state", "ready"], ["cancel", "--older-than", "-1"],
                 ["cancel", "--kind", "bad kind!"]):
        code, _, err = run_cli("--root", root, *args)
        assert code == 1 and err.count("\n") == 1, (args, err)
    assert _state(root, "new-mail") is JobState.READY
    assert _state(root, "old-mail") is JobState.DEAD_LETTER


@pytest.mark.parametrize("argv", [
    ["enqueue", "note", "--id", "n1", '{"a": 1}'],
    ["enqueue", "note", "--delay", "0", "--id", "n1", '{"a": 1}'],
    ["enqueue", "note", "--json", "--id", "n1", '{"a": 1}'],
    ["enqueue", "--id", "n1", "note", '{"a": 1}'],
    ["enqueue", "note", '{"a": 1}', "--id", "n1"],
])
def test_enqueue_takes_its_options_before_or_after_the_payload(
        tmp_path: Path, argv: list[str]) -> None:
    """DESIGN §8 names `--id/--delay/--priority` as options: order-free. An option between
    KIND and PAYLOAD made argparse fill PAYLOAD empty and refuse the JSON (exit 1)."""
    root = tmp_path / "s"
    make_spool(root).close()
    res = run_cli("--root", root, *argv)
    assert res.code == 0, res.err
    with make_spool(root) as spool:
        job = spool.get("n1")
    assert job.payload == {"a": 1} and job.kind == "note"


def test_enqueue_still_refuses_a_stray_argument_or_a_mistyped_option(tmp_path: Path) -> None:
    root = tmp_path / "s"
    make_spool(root).close()
    for argv in (["enqueue", "note", "{}", "extra"], ["enqueue", "note", "--idd", "x", "{}"]):
        res = run_cli("--root", root, *argv)
        assert res.code == 1 and "unrecognized arguments" in res.err
    with make_spool(root) as spool:
        assert list(spool.jobs()) == []


def test_enqueue_reads_stdin_after_its_options(tmp_path: Path) -> None:
    root = tmp_path / "s"
    make_spool(root).close()
    res = run_cli("--root", root, "enqueue", "note", "--id", "n2", "-", stdin='{"b": 2}')
    assert res.code == 0, res.err
    with make_spool(root) as spool:
        assert spool.get("n2").payload == {"b": 2}


def test_worker_takes_poll_for_its_idle_safety_poll(tmp_path: Path) -> None:
    """README and issue 14: `--poll` sets an idle worker's safety poll; it was refused as
    an unrecognized argument. A pool hands it to every child."""
    from jobspool.cli.pool import _child_options

    args = build_parser().parse_args(["worker", "--app", "m:app", "--poll", "2.5"])
    assert args.poll == 2.5
    assert ["--poll", "2.5"] == _child_options(args)[6:8]
    assert build_parser().parse_args(["worker", "--app", "m:app"]).poll == 0.5
    root = tmp_path / "s"
    make_spool(root).close()
    for bad in ("0", "-1", "soon", "1e-9"):
        res = run_cli("--root", root, "worker", "--app", "m:app", "--poll", bad)
        assert res.code == 1 and "--poll" in res.err
    # 1e-9 kept a core busy listing the directory: the floor is named.
    assert "below 0.01 s" in run_cli("--root", root, "worker", "--app", "m:app", "--poll",
                                     "0.001").err


def test_run_forever_refuses_a_safety_poll_below_the_floor(tmp_path: Path) -> None:
    from jobspool import Worker
    from jobspool.errors import InvalidJob

    with make_spool(tmp_path / "s") as spool:
        worker = Worker(spool, {"k": lambda job, ctx: None})
        with pytest.raises(InvalidJob, match="poll_seconds must be at least 0.01"):
            worker.run_forever(poll_seconds=1e-9, handle_signals=False)
