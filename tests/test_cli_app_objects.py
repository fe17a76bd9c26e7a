"""What `--app` names beyond a `jobspool.App`, and what its module does as it loads: an
object with `handlers` whose attributes raise or hold the wrong type, and a module that
prints at import while the command answers in JSON on stdout.

Each runs `python -m jobspool` as a real process: exit codes, one stderr line, no traceback
and what reaches file descriptor 1 are what only a real process shows.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.cli_harness import Result, app_module, one_error_line, run_jobspool
from tests.spools import make_spool


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    make_spool(path).close()
    return path


def failed_as_json(res: Result) -> str:
    """The one error line of a `--json` command that failed with exit 1, after checking that
    stdout is the `{"ok": false, ...}` document saying the same."""
    line = one_error_line(res, code=1)
    doc = orjson.loads(res.out)
    assert doc["ok"] is False and doc["exit"] == 1, doc
    assert line == f"jobspool: error: {doc['error']}", (line, doc)
    return line


# ---------------------------------------------------------------- an object with handlers

_HANDLER = "def ok(job, ctx):\n    return 1\n\n"


@pytest.mark.parametrize(("body", "attribute"), [
    ("class H:\n    def __getattr__(self, name):\n        raise RuntimeError('lazy ' + name)\n",
     "handlers"),
    ("class H:\n    @property\n    def handlers(self):\n        raise ValueError('boom prop')\n",
     "handlers"),
    ("class H:\n    handlers = {'ok': ok}\n"
     "    @property\n    def policies(self):\n        raise RuntimeError('no policies')\n",
     "policies"),
    ("class H:\n    handlers = {'ok': ok}\n    keys = ['path']\n", "keys"),
], ids=["getattr-raises", "property-raises-valueerror", "policies-property-raises",
        "keys-a-list"])
def test_an_app_object_with_a_bad_attribute_is_one_line_naming_app_and_the_attribute(
        tmp_path: Path, root: Path, body: str, attribute: str) -> None:
    env = app_module(tmp_path, "objapp", _HANDLER + body + "\napp = H()\n")
    res = run_jobspool("run-until-idle", "--app", "objapp:app", "--json", root=root, env=env)
    line = failed_as_json(res)
    assert "--app 'objapp:app'" in line and attribute in line, line


def test_an_app_object_with_policies_as_a_list_is_refused_as_app_refuses_it(
        tmp_path: Path, root: Path) -> None:
    # The message App(...) gives for the same value, not a TypeError from dict().
    env = app_module(tmp_path, "polapp", _HANDLER + "from jobspool import Policy\n\n"
                     "class H:\n    handlers = {'ok': ok}\n    policies = [Policy(timeout=5)]\n"
                     "\napp = H()\n")
    res = run_jobspool("run-until-idle", "--app", "polapp:app", root=root, env=env)
    line = one_error_line(res, code=1)
    assert line.endswith("policies must be a mapping of kind -> Policy, got list"), line


def test_a_good_app_object_still_runs_its_jobs(tmp_path: Path, root: Path) -> None:
    # A guard for the checks above: an object with handlers, policies and keys as mappings.
    env = app_module(tmp_path, "goodobj", _HANDLER + "from jobspool import Policy\n\n"
                     "class H:\n    handlers = {'ok': ok}\n"
                     "    policies = {'ok': Policy(timeout=5)}\n    keys = {}\n\napp = H()\n")
    with make_spool(root, create=False) as spool:
        spool.enqueue("ok")
    res = run_jobspool("run-until-idle", "--app", "goodobj:app", "--json", root=root, env=env)
    assert res.code == 0, res.err
    assert orjson.loads(res.out)["completed"] == 1


# ---------------------------------------------------------------- output at import

_SCHEDULED = ("from jobspool import App, Schedule\n\n" + _HANDLER
              + "app = App(handlers={'ok': ok}, schedules=[Schedule('ok', every=60)])\n")


def test_schedules_json_keeps_what_the_app_prints_at_import_off_stdout(
        tmp_path: Path, root: Path) -> None:
    env = app_module(tmp_path, "chatty", "print('loading my app...')\n" + _SCHEDULED)
    res = run_jobspool("schedules", "--app", "chatty:app", "--json", root=root, env=env)
    assert res.code == 0, res.err
    assert [row["kind"] for row in orjson.loads(res.out)] == ["ok"]
    assert "loading my app..." in res.err


@pytest.mark.parametrize("command", [("run-until-idle",), ("schedules",)])
def test_what_the_app_writes_to_fd_1_at_import_stays_off_stdout_under_json(
        tmp_path: Path, root: Path, command: tuple[str, ...]) -> None:
    # os.write(1, ...) stands for a child process or a C extension: none goes by sys.stdout.
    env = app_module(tmp_path, "rawapp", "import os\nos.write(1, b'raw at import\\n')\n"
                     + _SCHEDULED)
    res = run_jobspool(*command, "--app", "rawapp:app", "--json", root=root, env=env)
    assert res.code == 0, res.err
    orjson.loads(res.out)  # one JSON document, nothing before it
    assert "raw at import" in res.err


def test_stdout_is_given_back_when_the_app_fails_after_writing_to_fd_1(
        tmp_path: Path, root: Path) -> None:
    env = app_module(tmp_path, "rawfail", "import os\nos.write(1, b'raw at import\\n')\n"
                     "raise RuntimeError('cannot load')\n")
    res = run_jobspool("run-until-idle", "--app", "rawfail:app", "--json", root=root, env=env)
    assert res.code == 1 and "Traceback" not in res.err, res.err
    doc = orjson.loads(res.out)  # the error document reached stdout, and nothing else did
    assert doc["ok"] is False and "cannot load" in doc["error"], doc
    assert res.err.splitlines() == ["raw at import", f"jobspool: error: {doc['error']}"]


@pytest.mark.parametrize(("spec", "says"), [
    ("objapp:app.nope", "objapp:app has no attribute 'nope'"),
    ("objapp:nope.handlers", "module 'objapp' has no attribute 'nope'"),
    ("objapp:app.handlers.nope", "objapp:app.handlers has no attribute 'nope'"),
])
def test_a_dotted_app_path_names_the_step_that_has_no_such_attribute(
        tmp_path: Path, root: Path, spec: str, says: str) -> None:
    # Found by a CLI probe: "module 'objapp' has no attribute 'app.nope'" sent people
    # looking for a module attribute with a dot in its name.
    env = app_module(tmp_path, "objapp", _HANDLER + "class H:\n    handlers = {'ok': ok}\n"
                     "\napp = H()\n")
    res = run_jobspool("run-until-idle", "--app", spec, "--json", root=root, env=env)
    assert says in failed_as_json(res)
