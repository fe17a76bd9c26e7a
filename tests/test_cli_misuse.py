"""Misuse the command line survives with one line: an `--app` module raising what is not an
Exception at import, an endless stdin payload, a blank or space-padded spool root.

Each runs `python -m jobspool` as a real process: exit codes, one stderr line and no
traceback are what only a real process shows.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_harness import app_module, one_error_line, reap, run_jobspool, start_jobspool
from tests.spools import make_spool


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    make_spool(path).close()
    return path


# ---------------------------------------------------------------- --app raising at import


@pytest.mark.parametrize(("source", "names"), [
    ("class Boom(BaseException):\n    pass\n\nraise Boom('kaboom')\n", ("Boom", "kaboom")),
    ("raise GeneratorExit('not a generator')\n", ("GeneratorExit", "not a generator")),
], ids=["custom-base-exception", "generator-exit"])
def test_app_module_raising_a_base_exception_at_import_is_one_line(
        tmp_path: Path, root: Path, source: str, names: tuple[str, ...]) -> None:
    env = app_module(tmp_path, "boomapp", source)
    with make_spool(root, create=False) as spool:
        job = spool.enqueue("work")
    res = run_jobspool("run-until-idle", "--app", "boomapp:app", root=root, env=env)
    # Exit 1: what every other bad --app gets (a UsageError, jobspool.cli.common._load_app).
    line = one_error_line(res, code=1)
    for word in ("boomapp", *names):
        assert word in line, line
    with make_spool(root, create=False) as spool:
        assert spool.get(job.id).state.value == "ready"


def test_app_module_raising_keyboard_interrupt_at_import_is_its_failure_not_a_sigint(
        tmp_path: Path, root: Path) -> None:
    env = app_module(tmp_path, "kiapp", "raise KeyboardInterrupt\n")
    res = run_jobspool("run-until-idle", "--app", "kiapp:app", root=root, env=env)
    line = one_error_line(res, code=1)  # not 130: no signal came
    assert "kiapp" in line and "KeyboardInterrupt" in line, line
    assert "interrupted" not in line, line


def test_a_real_sigint_while_the_app_module_imports_is_still_an_interrupt(
        tmp_path: Path, root: Path) -> None:
    # A guard for the fix above (this passed before it too): a Ctrl-C that actually came
    # during a slow import is the operator's, exit 130 as anywhere else.
    env = app_module(tmp_path, "slowapp", "import os, signal, time\n"
                     "os.kill(os.getpid(), signal.SIGINT)\n"
                     "time.sleep(30)\n")
    res = run_jobspool("run-until-idle", "--app", "slowapp:app", root=root, env=env, timeout=60)
    line = one_error_line(res, code=130)
    assert "interrupted by SIGINT" in line, line


# ---------------------------------------------------------------- enqueue KIND -


def test_enqueue_stdin_over_the_limit_is_refused_without_reading_to_its_end(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root, max_job_bytes=1024).close()
    proc = start_jobspool("--root", root, "enqueue", "work", "-", stdin=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        # More than the limit, and the pipe left open: a command reading stdin to its end
        # would wait for ever (`yes | jobspool enqueue work -`).
        # Past the 16x slack stdin is read with (1024 here), within a pipe's buffer.
        proc.stdin.write(b"[" + b"1," * 10_000)
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is not None, "enqueue kept reading stdin past the spool's limit"
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
    finally:
        reap(proc)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(BrokenPipeError):  # what was unread stays unread
                if pipe is not None:
                    pipe.close()
    assert proc.returncode == 1, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobspool: error: "), lines
    assert "stdin" in lines[0] and "1024" in lines[0], lines[0]
    with make_spool(root, create=False) as spool:
        assert spool.stats().total == 0


def test_an_indented_payload_on_stdin_fits_as_it_does_as_an_argument(tmp_path: Path) -> None:
    # Found probing producers: a payload indented as `jq .` prints it, three times its
    # compact size, was accepted as PAYLOAD_JSON but refused from stdin as over the limit.
    root = tmp_path / "spool"
    make_spool(root, max_job_bytes=4096).close()
    payload = {"items": [{"n": i, "tag": "t"} for i in range(60)]}
    text = json.dumps(payload, indent=12)
    assert len(text) > 4096 > len(json.dumps(payload, separators=(",", ":")))
    res = run_jobspool("enqueue", "work", "-", "--id", "piped", root=root, stdin=text)
    assert res.code == 0, res.err
    with make_spool(root, create=False) as spool:
        assert spool.get("piped").payload == payload


def test_enqueue_from_a_closed_stdin_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    # Found probing producers: `jobspool enqueue k - <&-` died with an AttributeError
    # traceback (sys.stdin is None when the descriptor is closed).
    root = tmp_path / "spool"
    make_spool(root).close()
    res = run_jobspool("enqueue", "work", "-", root=root, prefix=("sh", "-c", 'exec "$@" <&-', "sh"))
    assert res.code == 1, res.err
    assert "Traceback" not in res.err and "stdin is closed" in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1, res.err
    with make_spool(root, create=False) as spool:
        assert spool.stats().total == 0


# ---------------------------------------------------------------- blank or padded roots


# Blank or padded, a root given malformed is bad input: exit 1, as "no spool given" is (the
# spool layer refuses whitespace before a URL the same way: `InvalidRoot`).
@pytest.mark.parametrize(("args", "env", "code", "shown"), [
    ((), {"JOBSPOOL_ROOT": " "}, 1, "JOBSPOOL_ROOT ' '"),
    # Set but empty is unset (as shells take it): "no spool given", nothing made here.
    ((), {"JOBSPOOL_ROOT": ""}, 1, "no spool given"),
    ((), {"JOBSPOOL_ROOT": "spool "}, 1, "JOBSPOOL_ROOT 'spool '"),
    (("--root", ""), {}, 1, "--root ''"),
    (("--root", "\t"), {}, 1, "--root '\\t'"),
    (("--root", " spool"), {}, 1, "--root ' spool'"),
    # An empty --root fell through to JOBSPOOL_ROOT without a word.
    (("--root", ""), {"JOBSPOOL_ROOT": "envspool"}, 1, "--root ''"),
    # Refused by the spool layer before, with the password shown (its redaction is
    # anchored at the scheme, which the space hid).
    (("--root", " postgresql://u:S3CRET@127.0.0.1:1/db"), {}, 1,
     "--root ' postgresql://u:***@127.0.0.1:1/db'"),
], ids=["env-space", "env-empty", "env-padded", "root-empty", "root-tab", "root-padded",
        "root-empty-over-env", "root-padded-url"])
def test_a_blank_or_padded_root_is_refused_naming_it_and_where_it_came_from(
        tmp_path: Path, args: tuple[str, ...], env: dict[str, str | None], code: int,
        shown: str) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    res = run_jobspool(*args, "init", env=env, cwd=cwd)
    line = one_error_line(res, code=code)
    assert shown in line, line
    assert "S3CRET" not in res.out + res.err
    assert list(cwd.iterdir()) == [], "a spool was created in the working directory"


@pytest.mark.parametrize("root", ["", "  ", " /tmp/spool", "/tmp/spool\n"])
def test_spool_refuses_a_blank_or_padded_root_as_an_invalid_root(root: str) -> None:
    # The README says `Spool()` raises InvalidRoot for a root given malformed; the
    # padded and blank ones were a plain SpoolError (not a ConfigError).
    from jobspool import InvalidRoot, Spool
    from jobspool.errors import ConfigError, SpoolError

    with pytest.raises(InvalidRoot) as raised:
        Spool(root)
    assert isinstance(raised.value, SpoolError) and isinstance(raised.value, ConfigError)


@pytest.mark.parametrize("root", ["~/spool", "~me/spool", "$HOME/spool", "${XDG_DATA_HOME}/q"])
def test_spool_refuses_a_root_no_shell_expanded_as_the_cli_does(
        root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A README probe: `Spool(os.environ["JOBSPOOL_ROOT"])` with `~/spool` from an env file
    # made a directory named `~` in the working directory; the CLI refused it already.
    from jobspool import InvalidRoot, Spool

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidRoot, match="which no shell expanded"):
        Spool(root)
    assert list(tmp_path.iterdir()) == []


def test_a_root_that_names_a_tilde_directory_on_purpose_still_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A regression probe: `./~x` (and the Path the CLI makes of it, which drops the `./`)
    # was refused as an unexpanded `~` once Spool() checked roots too.
    from jobspool import Spool

    monkeypatch.chdir(tmp_path)
    Spool(tmp_path / "~x").close()  # made by absolute path
    for root in ("./~x", Path("~x"), "./$HOME-like"):
        Spool(root).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["$HOME-like", "~x"]
    res = run_jobspool("--root", "./~x", "stats", cwd=tmp_path)
    assert res.code == 0, res.err
