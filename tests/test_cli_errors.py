"""Exit codes and error messages of the command line (DESIGN §8), through a subprocess.

0 success; 1 usage or bad input; 2 the spool is unhealthy or an operation was
refused. Every failure prints exactly one line on stderr (`jobspool: error: ...`),
never a traceback, and changes nothing on disk. Under `--json` stdout still
carries one JSON document describing the error.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.cli_harness import Result, one_error_line, run_jobspool
from tests.helpers_spool import job_files
from tests.spools import make_spool

APP = "tests.apps.simple:app"


def refused(code: int, *args: str | Path, mentions: tuple[str, ...] = (), **kwargs: Any
            ) -> Result:
    """Run a command that must fail with `code`, one stderr line, and no traceback."""
    r = run_jobspool(*args, **kwargs)
    assert r.code == code, f"expected exit {code}, got {r.code}; stderr: {r.err!r}"
    assert "Traceback" not in r.err, r.err
    lines = r.err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {r.err!r}"
    assert lines[0].startswith("jobspool: "), lines[0]
    for word in mentions:
        assert word in lines[0], f"{word!r} not named in {lines[0]!r}"
    return r


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "spool"
    make_spool(r).close()
    return r


@pytest.fixture
def populated(root: Path) -> Path:
    """A spool with one completed job (`done-1`) and one ready job (`ready-1`)."""
    with make_spool(root) as spool:
        spool.enqueue("work", job_id="done-1")
        spool.enqueue("work", job_id="ready-1", delay=0.0, priority=1)
        (lease,) = spool.claim()
        assert lease.job_id == "done-1"
        spool.complete(lease)
    return root


# ---------------------------------------------------------------- exit 1: bad input


@pytest.mark.parametrize(("args", "mentions"), [
    (("enqueue", "bad kind"), ("bad kind",)),
    (("enqueue", "9lives"), ("9lives",)),
    (("enqueue", "work", "--id", "../x"), ("../x",)),
    (("enqueue", "work", "--id", "a/b"), ("a/b",)),
    (("enqueue", "work", "--id", ".hidden"), (".hidden",)),
    (("enqueue", "work", "{not json"), ("JSON",)),
    (("enqueue", "work", "--delay", "soon"), ("soon",)),
    (("enqueue", "work", "--delay", "-1"), ("-1",)),
    (("enqueue", "work", "--delay", "nan"), ("nan",)),
    (("enqueue", "work", "--priority", "high"), ("high",)),
    (("enqueue", "work", "--max-attempts", "0"), ("0",)),
    (("enqueue", "work", '"' + "x" * 70_000 + '"'), ("65536",)),
    (("enqueue", "work", "9" * 5000), ("PAYLOAD_JSON", "64-bit")),
    (("enqueue", "work", "[" * 10_000 + "]" * 10_000), ("PAYLOAD_JSON", "deeper than 253")),
    (("enqueue", "work", "[" * 300 + "]" * 300), ("levels)...", "deeper than 253")),
    (("enqueue",), ("kind",)),
], ids=["kind-space", "kind-digit", "id-dotdot", "id-slash", "id-dot", "bad-json",
        "delay-word", "delay-negative", "delay-nan", "priority-word", "attempts-zero",
        "payload-too-large", "int-past-4300-digits", "nested-10000", "nested-300", "no-kind"])
def test_enqueue_bad_input_exits_1_and_writes_nothing(
        root: Path, args: tuple[str, ...], mentions: tuple[str, ...]) -> None:
    refused(1, "--root", root, *args, mentions=mentions)
    assert job_files(root) == {}
    assert not (root.parent / "x.json").exists()


def test_enqueue_bytes_that_are_not_utf8_are_named_so(root: Path) -> None:
    # The argument reaches the child as the byte 0xff (os.fsencode), not as text.
    refused(1, "--root", root, "enqueue", "work", '"\udcff"',
            mentions=("PAYLOAD_JSON", "not valid UTF-8"))


def test_enqueue_bad_json_on_stdin_exits_1(root: Path) -> None:
    refused(1, "--root", root, "enqueue", "work", "-", stdin="{'single': 'quotes'}",
            mentions=("stdin", "JSON"))
    refused(1, "--root", root, "enqueue", "work", "-", stdin="", mentions=("stdin",))


def test_json_lines_on_stdin_are_named_as_such_and_nothing_is_enqueued(root: Path) -> None:
    """Piping a JSON Lines file gave only "Extra data: line 2 column 1": the user was left
    guessing that enqueue takes one payload per call."""
    refused(1, "--root", root, "enqueue", "work", "-", stdin='{"a": 1}\n{"a": 2}\n',
            mentions=("more than one JSON document", "one job per call"))
    assert not job_files(root)
    assert job_files(root) == {}


@pytest.mark.parametrize("command", ["run-until-idle", "worker"])
@pytest.mark.parametrize(("app", "mentions"), [
    ("no_such_module_anywhere:app", ("no_such_module_anywhere",)),
    ("tests.apps.simple:no_such_attr", ("no_such_attr",)),
    ("tests.apps.empty:app", ("tests.apps.empty:app", "no handlers")),
    ("tests.apps.empty:handlers", ("tests.apps.empty:handlers", "no handlers")),
    ("tests.apps.plain:not_handlers", ("not_handlers",)),
    ("tests.apps.broken:app", ("tests.apps.broken", "refuses to be imported")),
    ("tests.apps.simple", ("MODULE:ATTR",)),
    (":app", ("MODULE:ATTR",)),
    ("tests.apps.lazy:app", ("lazy load failed",)),
    ("tests.apps.script:app", ("sys.exit(3)", "script")),
], ids=["missing-module", "missing-attr", "empty-app", "empty-dict", "not-handlers",
        "import-raises", "no-colon", "no-module", "getattr-raises", "a-script"])
def test_a_bad_app_exits_1_with_one_line_naming_it(
        root: Path, command: str, app: str, mentions: tuple[str, ...]) -> None:
    with make_spool(root) as spool:
        job = spool.enqueue("work")
    refused(1, "--root", root, command, "--app", app, mentions=mentions)
    with make_spool(root, create=False) as spool:
        after = spool.get(job.id)
        assert after.state.value == "ready" and after.attempts == 0


@pytest.mark.parametrize(("args", "mentions"), [
    (("--kinds", "work,nope"), ("nope",)),
    (("--concurrency", "0"), ("0",)),
    (("--concurrency", "many"), ("many",)),
    (("--batch-size", "-3"), ("-3",)),
    (("--max-jobs", "-1"), ("-1",)),
    (("--lease-seconds", "0"), ("0",)),
    (("--wait-retries", "later"), ("later",)),
], ids=["kinds-unknown", "concurrency-zero", "concurrency-word", "batch-negative",
        "max-jobs-negative", "lease-zero", "wait-word"])
def test_run_until_idle_bad_options_exit_1(root: Path, args: tuple[str, ...],
                                          mentions: tuple[str, ...]) -> None:
    refused(1, "--root", root, "run-until-idle", "--app", APP, *args, mentions=mentions)


def test_run_until_idle_without_app_exits_1(root: Path) -> None:
    refused(1, "--root", root, "run-until-idle", mentions=("--app",))


def test_an_unknown_command_exits_1(root: Path) -> None:
    refused(1, "--root", root, "frobnicate", mentions=("frobnicate",))


def test_no_command_exits_1() -> None:
    r = refused(1, mentions=("COMMAND",))
    assert not r.err.startswith("jobspool: error: jobspool"), r.err  # named once


def test_a_subcommand_usage_error_names_the_subcommand_once(root: Path) -> None:
    r = refused(1, "--root", root, "worker", mentions=("worker", "--app"))
    assert r.err.count("jobspool") == 1, r.err


def test_an_unknown_option_exits_1(root: Path) -> None:
    refused(1, "--root", root, "stats", "--colour", mentions=("--colour",))


def test_no_root_given_exits_1() -> None:
    refused(1, "stats", mentions=("--root", "JOBSPOOL_ROOT"))
    refused(1, "enqueue", "work", mentions=("--root", "JOBSPOOL_ROOT"))


def test_a_spool_that_does_not_exist_is_named_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    r = run_jobspool("--root", missing, "stats")
    # Bad input (1) or refused (2): either way one line naming it and the way out.
    assert r.code in (1, 2)
    refused(r.code, "--root", missing, "stats", mentions=(str(missing), "init"))
    assert not missing.exists()


@pytest.mark.parametrize("args", [("show", "nope"), ("cancel", "nope"), ("requeue", "nope")])
def test_an_unknown_job_id_exits_1_naming_it(root: Path, args: tuple[str, ...]) -> None:
    refused(1, "--root", root, *args, mentions=("nope",))


@pytest.mark.parametrize("command", ["show", "cancel", "requeue"])
def test_an_invalid_job_id_exits_1(root: Path, command: str) -> None:
    refused(1, "--root", root, command, "../x", mentions=("../x",))


def test_requeue_needs_exactly_one_of_an_id_or_all_dead(root: Path) -> None:
    refused(1, "--root", root, "requeue")
    refused(1, "--root", root, "requeue", "x", "--all-dead")


def test_list_with_an_unknown_state_or_bad_kind_exits_1(root: Path) -> None:
    refused(1, "--root", root, "list", "--state", "finished", mentions=("finished",))
    refused(1, "--root", root, "list", "--kind", "no/kind", mentions=("no/kind",))


def test_recover_with_a_bad_app_exits_1(root: Path) -> None:
    refused(1, "--root", root, "recover", "--app", "no_such_module_anywhere:app",
            mentions=("no_such_module_anywhere",))


def test_demo_with_a_bad_job_count_exits_1(tmp_path: Path) -> None:
    refused(1, "--root", tmp_path / "d", "demo", "--jobs", "0")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("flag", ["--json", "--js"])  # argparse takes a unique prefix
def test_json_errors_are_one_json_document_on_stdout(root: Path, flag: str) -> None:
    r = refused(1, "--root", root, "enqueue", "bad kind", flag)
    doc = orjson.loads(r.out)
    assert doc["ok"] is False
    assert doc["exit"] == 1
    assert "bad kind" in doc["error"]


# ---------------------------------------------------------------- exit 2: refused / unhealthy


def test_cancel_of_a_completed_job_is_refused_with_2(populated: Path) -> None:
    refused(2, "--root", populated, "cancel", "done-1", mentions=("done-1", "completed"))
    with make_spool(populated, create=False) as spool:
        assert spool.get("done-1").state.value == "completed"


def test_requeue_of_a_ready_job_is_refused_with_2(populated: Path) -> None:
    refused(2, "--root", populated, "requeue", "ready-1", mentions=("ready-1",))


def test_fsck_on_a_corrupted_spool_exits_2_and_names_the_file(root: Path) -> None:
    with make_spool(root) as spool:
        spool.enqueue("work", job_id="good")
    bad = root / "ready" / "broken.json"
    bad.write_bytes(b"{this is not json")
    r = run_jobspool("--root", root, "fsck", "--json")
    assert r.code == 2, r.err
    doc = orjson.loads(r.out)
    assert doc["ok"] is False
    assert any("broken.json" in p for p in doc["problems"])
    text = run_jobspool("--root", root, "fsck")
    assert text.code == 2
    assert "broken.json" in text.out
    assert bad.read_bytes() == b"{this is not json"  # fsck changes nothing


def test_fsck_finds_a_job_in_two_state_directories(root: Path) -> None:
    with make_spool(root) as spool:
        spool.enqueue("work", job_id="twice")
    # A crash between rename and unlink leaves two copies (DESIGN §2); fsck must say so.
    data = (root / "ready" / "twice.json").read_bytes()
    (root / "completed" / "twice.json").write_bytes(data)
    r = run_jobspool("--root", root, "fsck", "--json")
    assert r.code == 2
    assert any("twice" in p for p in orjson.loads(r.out)["problems"]), r.out


@pytest.mark.parametrize("command", [("stats",), ("init",), ("enqueue", "work"), ("fsck",),
                                     ("list",), ("run-until-idle", "--app", APP)])
def test_a_spool_root_that_is_a_file_exits_2(tmp_path: Path, command: tuple[str, ...]) -> None:
    f = tmp_path / "not-a-dir"
    f.write_text("hello")
    refused(2, "--root", f, *command, mentions=(str(f),))
    assert f.read_text() == "hello"


def test_a_state_directory_replaced_by_a_symlink_is_refused_with_2(
        root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "ready").rmdir()
    (root / "ready").symlink_to(elsewhere)
    refused(2, "--root", root, "enqueue", "work", mentions=("ready",))
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("name", ["metrics", "progress"])
def test_a_symlinked_metrics_or_progress_directory_is_refused_with_2(
        root: Path, tmp_path: Path, name: str) -> None:
    """Made on first write, so not checked as state directories are: a link in their
    place sent a worker's metrics or a job's progress outside the spool."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if (root / name).is_dir():
        shutil.rmtree(root / name)
    (root / name).symlink_to(elsewhere)
    refused(2, "--root", root, "run-until-idle", "--app", "tests.apps.simple:app",
            mentions=(name, "symlink"))
    assert list(elsewhere.iterdir()) == []


def test_health_of_a_degraded_spool_exits_2(root: Path) -> None:
    with make_spool(root) as spool:
        spool.enqueue("work")
        (lease,) = spool.claim()
        spool.fail(lease, "broken", retryable=False)
    r = run_jobspool("--root", root, "health")
    assert r.code == 2
    assert "dead_letters" in r.out
    assert "Traceback" not in r.err


@pytest.mark.parametrize("command", ["worker", "run-until-idle"])
def test_a_worker_that_cannot_claim_gives_up_with_2_instead_of_serving_dead(
        root: Path, command: str) -> None:
    """The supervised loop restarts after a failure of its own machinery, and after
    repeated quick failures exits non-zero (2: the spool is unhealthy) with one last
    line naming the cause, rather than a traceback or a process that serves nothing."""
    with make_spool(root) as spool:
        spool.enqueue("work")
    (root / "fence").write_text("garbage")
    r = run_jobspool("--root", root, command, "--app", APP, "--json")
    assert r.code == 2, r.err[-2000:]
    last = r.err.strip().splitlines()[-1]
    assert last.startswith("jobspool: error:"), last
    assert "fence" in last
    doc = orjson.loads(r.out)
    assert doc["ok"] is False and doc["exit"] == 2


@pytest.mark.parametrize("states", [",", ""])
def test_unique_states_naming_no_state_is_refused(root: Path, states: str) -> None:
    # Found in a producers pass: "," became an empty set, and the enqueue silently
    # replaced an existing ready job.
    with make_spool(root) as spool:
        spool.enqueue("work", {"v": 1}, job_id="j")
    refused(1, "--root", root, "enqueue", "work", '{"v": 2}', "--id", "j",
            "--on-conflict", "replace", "--unique-states", states, mentions=("--unique-states",))
    with make_spool(root) as spool:
        assert spool.get("j").payload == {"v": 1}


def test_a_malformed_postgresql_url_is_bad_input_exit_1() -> None:
    """DESIGN §8: 1 is usage or bad input, 2 a spool that refuses or is unhealthy: a typo in
    the URL must not read as a database that is down."""
    from tests.cli_harness import run_cli

    got = run_cli("stats", root="postgresql://[garbage")
    assert got.code == 1, got
    assert got.err.count("\n") == 1 and "bad PostgreSQL URL" in got.err


@pytest.mark.parametrize("url", ["postgresql://u@127.0.0.1:1/db?sslmode=bogus",
                                 "postgresql://u@127.0.0.1:abc/db",
                                 # a host name: libpq looked the port up as a service name,
                                 # "failed to resolve host 'localhost'" (exit 2)
                                 "postgresql://u@localhost:abc/db",
                                 "postgresql://u@localhost:-5/db",
                                 "postgresql://u@localhost:70000/db"])
def test_a_url_option_libpq_refuses_is_bad_input_not_an_outage(url: str) -> None:
    """Found by a CLI fuzz: `?sslmode=bogus` read as a database that is down (exit 2), and
    a worker waited 30 s for it to come back. libpq refuses it before reaching any server."""
    from jobspool import Spool
    from jobspool.errors import ConfigError
    from tests.cli_harness import run_cli

    for command in ("stats", "enqueue"):
        got = run_cli(command, *(["k"] if command == "enqueue" else []), root=url)
        assert got.code == 1, got
        assert got.err.count("\n") == 1 and "bad PostgreSQL URL" in got.err, got.err
    with pytest.raises(ConfigError, match="bad PostgreSQL URL"):
        Spool(url)


def test_show_of_an_unreadable_job_file_says_so_once(tmp_path: Path) -> None:
    from tests.cli_harness import run_cli

    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    assert run_cli("enqueue", "k", "--id", "a1", root=root).code == 0
    (root / "ready" / "a1.json").write_text("garbage")
    from tests.cli_harness import run_jobspool

    for extra in ((), ("--json",)):
        # A process of its own: its log is stderr. The error names the file; a "skipping
        # unreadable job file" warning above it said the same (a CLI probe; DESIGN §8: one
        # line).
        got = run_jobspool("show", "a1", *extra, root=root)
        assert got.code == 2
        lines = [line for line in got.err.splitlines() if line.strip()]
        assert len(lines) == 1 and "ready/a1.json cannot be read" in lines[0], got.err


def test_health_warns_once_of_an_unreadable_file_it_meets_in_several_reads(
        populated: Path) -> None:
    # A completed job's file copied into dead_letter/: its id is in two directories, so
    # each read of the spool health makes (stats, leased, prepared) reads the bad copy.
    shutil.copy(populated / "completed" / "done-1.json", populated / "dead_letter" / "done-1.json")
    got = run_jobspool("--root", populated, "health")  # a process of its own: its log is stderr
    assert got.code == 2 and "Traceback" not in got.err, got.err
    warned = [line for line in got.err.splitlines() if "skipping unreadable job file" in line]
    assert len(warned) == 1 and "dead_letter/done-1.json" in warned[0], got.err


def test_an_empty_kinds_list_is_bad_input_not_every_kind(tmp_path: Path) -> None:
    """`--kinds "$KINDS"` with the variable empty ran every kind."""
    from tests.cli_harness import run_cli

    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    assert run_cli("enqueue", "work", root=root).code == 0
    for value in ("", ",", " , "):
        got = run_cli("run-until-idle", "--app", "tests.apps.simple:app", "--kinds", value,
                      root=root)
        assert got.code == 1, got
        assert "names no kind" in got.err
    assert "ready" in run_cli("list", root=root).out  # nothing ran


def test_a_kind_left_out_by_kinds_is_not_called_unhandled(tmp_path: Path) -> None:
    from tests.cli_harness import run_cli

    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    assert run_cli("enqueue", "flaky", root=root).code == 0
    got = run_cli("run-until-idle", "--app", "tests.apps.simple:app", "--kinds", "work",
                  root=root)
    assert got.code == 0
    assert "kind 'flaky': not in --kinds" in got.out
    assert "no handler" not in got.out


def test_show_indents_the_line_breaks_of_a_value(tmp_path: Path) -> None:
    """A handler's error cannot print lines of `show` that read as more fields."""
    from tests.cli_harness import run_cli
    from tests.spools import make_spool

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="ev1")
        spool.fail(spool.claim()[0], "line1\nstate: completed", retryable=False)
    out = run_cli("show", "ev1", root=root).out
    assert "\nstate: completed" not in out
    assert "   last_error: line1\n               state: completed" in out


def test_a_command_run_with_stdout_and_stderr_closed_does_its_work(tmp_path: Path) -> None:
    """`jobspool ... >&- 2>&-` (a daemon manager that closes them): the command did its
    work, then died on its first print with a traceback nobody could read, exit 1."""
    import shlex
    import subprocess

    from tests.cli_harness import command, environment

    root = tmp_path / "spool"
    # A command that only reads fails instead: its output, all it does, was lost.
    for args, code in ((("init",), 0), (("enqueue", "k", "{}", "--id", "j1"), 0),
                       (("stats",), 2)):
        line = " ".join(shlex.quote(a) for a in command(*args, root=root))
        done = subprocess.run(["sh", "-c", f"exec {line} >&- 2>&-"], env=environment(),
                              timeout=120, check=False)
        assert done.returncode == code, args
    from tests.spools import make_spool

    with make_spool(root) as spool:
        assert spool.get("j1").kind == "k"


def test_an_empty_projection_is_bad_input(tmp_path: Path) -> None:
    """`--projection ""` fell back to the default projection without a word."""
    from tests.cli_harness import run_cli

    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    for args in (("maintain",), ("health",),
                 ("run-until-idle", "--app", "tests.apps.simple:app")):
        got = run_cli(*args, "--projection", "", root=root)
        assert got.code == 1, (args, got)
        assert "--projection" in got.err and "empty" in got.err


def test_init_refuses_an_absurd_max_job_bytes_and_list_a_zero_limit(tmp_path: Path) -> None:
    """A 1 TB `--max-job-bytes` was accepted and saved; `list --limit 0` printed "no jobs"
    for a spool holding jobs."""
    from tests.cli_harness import run_cli

    root = tmp_path / "spool"
    got = run_cli("init", "--max-job-bytes", "999999999999", root=root)
    assert got.code == 1 and "max_job_bytes" in got.err
    assert not (root / "spool.json").exists()
    assert run_cli("init", root=root).code == 0
    assert run_cli("enqueue", "k", root=root).code == 0
    got = run_cli("list", "--limit", "0", root=root)
    assert got.code == 1 and "--limit" in got.err
    # An HTTP probe: a huge one failed as "Stop argument for islice() must be ...".
    got = run_cli("list", "--limit", "99999999999999999999", root=root)
    assert got.code == 1 and "--limit" in got.err and "too large" in got.err, got.err


def test_a_raw_disk_full_error_gets_the_usual_hint(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`recover` on a full disk printed only "No space left on device", unlike every other
    write failure, which says to free space and run recover."""
    import errno

    from jobspool.queue.spool import Spool
    from tests.cli_harness import run_cli

    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0

    def full(self, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(root / "quarantine"))

    monkeypatch.setattr(Spool, "recover", full)
    got = run_cli("recover", root=root)
    assert got.code == 2
    assert got.err.count("\n") == 1
    assert "No space left on device" in got.err and "free space" in got.err


@pytest.mark.parametrize("flags", [(), ("--json",)], ids=["text", "json"])
def test_a_stdout_that_cannot_be_written_is_named_not_the_spools_disk(
        root: Path, flags: tuple[str, ...]) -> None:
    """`> /dev/full`: with --json two chained tracebacks (the error JSON written to the same
    stdout again); without, "the disk is full ... run jobspool recover", blaming the spool."""
    import subprocess

    from tests.cli_harness import command, environment

    with open("/dev/full", "wb") as full:
        done = subprocess.run(command("--root", root, "stats", *flags), stdout=full,
                              stderr=subprocess.PIPE, env=environment(), timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    # `stats` only reads: nothing it did stands (a probe read that as a change made).
    assert err.strip().splitlines() == [
        "jobspool: error: cannot write the output to stdout: No space left on device"]
    with open("/dev/full", "wb") as full:
        made = subprocess.run(command("--root", root, "enqueue", "k", "{}", *flags),
                              stdout=full, stderr=subprocess.PIPE, env=environment(),
                              timeout=120)
    assert made.returncode == 2 and "(what the command did stands)" in made.stderr.decode()


@pytest.mark.parametrize("command_args", [("list",), ("--json", "list"), ("stats",),
                                          ("show", "j1"), ("fsck",), ("quarantine", "list")])
@pytest.mark.parametrize("stdout", ["/dev/full", "closed"])
def test_a_reading_command_whose_output_is_lost_says_so_and_fails(
        tmp_path: Path, command_args: tuple[str, ...], stdout: str) -> None:
    """Found by a probe: `list > /dev/full` blamed the spool's disk ("the disk is full ...
    run jobspool recover"); `list >&-` (or `stats`) printed nothing and exited 0."""
    import shlex
    import subprocess

    from tests.cli_harness import command, environment

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="j1")
    line = " ".join(shlex.quote(a) for a in command(*command_args, root=root))
    redirect = "> /dev/full" if stdout == "/dev/full" else ">&-"
    done = subprocess.run(["sh", "-c", f"exec {line} {redirect}"], env=environment(),
                          capture_output=True, timeout=120, check=False)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("jobspool: error: cannot write the output to stdout: "), err
    assert "recover" not in err


@pytest.mark.parametrize("value", ["1e-6", "1e-320", "0.0009"])
def test_a_time_limit_too_short_to_start_the_handler_is_refused_at_enqueue(
        tmp_path: Path, value: str) -> None:
    # Found by a CLI fuzz: `enqueue --timeout 1e-6` was taken, and run-until-idle then
    # claimed and gave the job back for ever (its limit passed before the handler began).
    from jobspool import Policy
    from jobspool.errors import InvalidJob, PolicyError

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        with pytest.raises(InvalidJob, match=r"at least 0\.001 s"):
            spool.enqueue("work", {}, timeout=float(value))
        assert spool.stats().total == 0
        spool.enqueue("work", {}, timeout=0.001)  # the floor itself is a limit
    with pytest.raises(PolicyError, match=r"at least 0\.001 s"):
        Policy(timeout=float(value))
    r = run_jobspool("--root", root, "enqueue", "work", "{}", "--timeout", value)
    assert r.returncode == 1 and "at least 0.001 s" in one_error_line(r)


@pytest.mark.parametrize("value", ["1e-6", "1e-320", "0.009"])
def test_a_worker_lease_too_short_to_start_a_job_is_refused(tmp_path: Path, value: str) -> None:
    # Found by a CLI fuzz: on PostgreSQL, run-until-idle --lease-seconds 1e-320 claimed one
    # job for ever (each lease lost before its handler could start, never charged).
    from jobspool import Worker
    from jobspool.errors import ConfigError

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {})
        with pytest.raises(ConfigError, match="too short for a worker"):
            Worker(spool, {"work": lambda job, ctx: None}, lease_seconds=float(value))
        assert spool.claim(lease_seconds=float(value))  # a raw claim may take any lease
    r = run_jobspool("--root", root, "run-until-idle", "--app", "tests.apps.simple:app",
                     "--lease-seconds", value)
    assert r.returncode == 1 and "too short for a worker" in one_error_line(r)


@pytest.mark.parametrize("root", ["~/spool", "~", "~me/spool", "$HOME/spool", "${STATE}/q"])
@pytest.mark.parametrize("via", ["option", "env"])
def test_a_root_no_shell_expanded_is_refused_and_nothing_is_made(
        tmp_path: Path, root: str, via: str) -> None:
    # Found by a CLI fuzz: JOBSPOOL_ROOT='~/spool' (quoted in a unit or env file) made
    # ./~/spool in the working directory, and a worker served it.
    args = ("--root", root, "init") if via == "option" else ("init",)
    r = run_jobspool(*args, env={"JOBSPOOL_ROOT": root} if via == "env" else None,
                     cwd=tmp_path)
    assert r.returncode == 1 and "no shell expanded" in one_error_line(r)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("host", ["", "  ", " 127.0.0.1"])
def test_a_blank_or_padded_metrics_host_is_refused_not_every_interface(
        tmp_path: Path, host: str) -> None:
    # `--metrics-host "$HOST"` with HOST unset listened on 0.0.0.0.
    make_spool(tmp_path / "s").close()
    got = run_jobspool("worker", "--app", "tests.apps.simple:app", "--metrics-port", "0",
                       "--metrics-host", host, root=tmp_path / "s")
    assert got.code == 1
    assert "--metrics-host" in one_error_line(got) and "not an address" in got.err


def test_a_one_shot_command_names_each_unreadable_file_once(tmp_path: Path) -> None:
    # `cancel --kind` lists the state, then reads each job again under the lock: every
    # skipped file was said twice.
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("ok", job_id="a")
    (root / "ready" / "bad.json").write_bytes(b"garbage")
    got = run_jobspool("cancel", "--kind", "ok", root=root)
    assert got.code == 0, got.err
    assert got.err.count("skipping unreadable job file ready/bad.json") == 1, got.err

