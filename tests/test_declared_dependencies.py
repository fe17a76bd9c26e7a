"""A plain `pip install jobspool` has only the declared dependencies: the commands must
run with nothing else importable.

The test environment holds much more (the test extras and what they pull in: sniffio
came with them, and `run-until-idle` imported it while anyio no longer depends on it,
so the README's first command died on a fresh machine). Every installed distribution
outside the closure of jobspool's base requirements is made unimportable in the
commands' processes and their children, through a `sitecustomize` on PYTHONPATH.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

BLOCKER = '''
import json, os, sys

_blocked = frozenset(json.loads(os.environ["JOBSPOOL_TEST_BLOCKED_MODULES"]))


class _Undeclared:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _blocked:
            raise ModuleNotFoundError(f"{name} is not a declared dependency of jobspool")
        return None


sys.meta_path.insert(0, _Undeclared())
'''


def _closure(extras: tuple[str, ...]) -> set[str]:
    """Distributions `pip install jobspool[EXTRAS]` brings: its requirements (and those of
    the extras asked for), recursively, as each installed distribution declares them,
    with the extras each requirement names."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [
        r for e in extras for r in project["optional-dependencies"][e]]
    seen: set[tuple[str, str]] = {("jobspool", "")}
    todo: list[tuple[str, str]] = []
    for text in declared:  # the checkout's own, not an editable install's stale metadata
        req = Requirement(text)
        todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
    while todo:
        name, extra = todo.pop()
        name = canonicalize_name(name)
        if (name, extra) in seen:
            continue
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # an optional platform dependency not installed here
        seen.add((name, extra))
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
    return {name for name, _ in seen}


def _blocked_modules(extras: tuple[str, ...]) -> list[str]:
    allowed = _closure(extras)
    assert "lancedb" in allowed and "orjson" in allowed, allowed
    blocked = []
    for module, dists in md.packages_distributions().items():
        if module == "jobspool" or module.startswith("_") or not module.isidentifier():
            continue
        if not any(canonicalize_name(d) in allowed for d in dists):
            blocked.append(module)
    return sorted(blocked)


REPO = Path(__file__).resolve().parents[1]


def _env_with(site: Path, extras: tuple[str, ...]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(site), str(REPO), env.get("PYTHONPATH", "")])
    env["JOBSPOOL_TEST_BLOCKED_MODULES"] = json.dumps(_blocked_modules(extras))
    env.pop("JOBSPOOL_ROOT", None)
    return env


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(BLOCKER)
    return site


@pytest.fixture(scope="module")
def bare_env(site_dir: Path) -> dict[str, str]:
    return _env_with(site_dir, ())


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobspool", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_blocker_blocks_what_the_test_extras_brought(bare_env: dict[str, str]) -> None:
    blocked = json.loads(bare_env["JOBSPOOL_TEST_BLOCKED_MODULES"])
    assert "pytest" in blocked and "hypothesis" in blocked
    assert "starlette" in blocked and "psycopg" in blocked  # the extras' own
    probe = subprocess.run([sys.executable, "-c", "import hypothesis"], env=bare_env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 1 and "not a declared dependency" in probe.stderr


def test_demo_runs_on_the_declared_dependencies_alone(
        bare_env: dict[str, str], tmp_path: Path) -> None:
    done = _run(bare_env, "demo", "--root", str(tmp_path / "demo"), "--jobs", "200",
                "--workers", "2", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "not a declared dependency" not in done.stderr


def test_the_everyday_commands_run_on_the_declared_dependencies_alone(
        bare_env: dict[str, str], tmp_path: Path) -> None:
    root = str(tmp_path / "spool")
    steps = [
        ["init", "--root", root],
        ["enqueue", "--root", root, "doc", json.dumps(_doc(1))],
        ["enqueue", "--root", root, "doc", json.dumps(_doc(2))],
        ["list", "--root", root],
        ["stats", "--root", root, "--json"],
        ["run-until-idle", "--root", root, "--app", "jobspool.demo:app"],
        ["recover", "--root", root],
        ["fsck", "--root", root],
        ["health", "--root", root],
        ["prune", "--root", root],
        ["maintain", "--root", root, "--app", "jobspool.demo:app"],
        ["schedules", "--root", root, "--app", "jobspool.demo:app"],
    ]
    for args in steps:
        done = _run(bare_env, *args)
        assert "Traceback" not in done.stderr, (args, done.stderr[-3000:])
        assert "not a declared dependency" not in done.stderr, (args, done.stderr[-3000:])
        assert done.returncode == 0, (args, done.returncode, done.stderr)
    stats = json.loads(_run(bare_env, "stats", "--root", root, "--json").stdout)
    assert stats["counts"]["completed"] == 2, stats


def _doc(n: int) -> dict[str, object]:
    return {"doc_id": f"d{n}", "title": f"doc {n}", "body": "alpha beta alpha", "rev": 1}


def test_the_dashboard_runs_on_jobspool_web_alone(site_dir: Path, tmp_path: Path) -> None:
    env = _env_with(site_dir, ("web",))
    root = str(tmp_path / "spool")
    assert _run(env, "enqueue", "--root", root, "--create", "doc", json.dumps(_doc(1))
                ).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "jobspool", "dashboard", "--root", root,
                             "--port", "0", "--poll", "0"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the URL it serves, once listening
        url = next((w for w in line.split() if w.startswith("http://")), None)
        assert url is not None, (line, proc.poll())
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=60) as page:
            assert page.status == 200 and "ready" in page.read().decode()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "not a declared dependency" not in err, err


def test_the_postgresql_store_runs_on_jobspool_postgres_alone(
        site_dir: Path, pg_url: str) -> None:
    env = _env_with(site_dir, ("postgres",))
    for args in (["init", "--root", pg_url],
                 ["enqueue", "--root", pg_url, "doc", json.dumps(_doc(1))],
                 ["run-until-idle", "--root", pg_url, "--app", "jobspool.demo:app"],
                 ["fsck", "--root", pg_url]):
        done = _run(env, *args)
        assert done.returncode == 0, (args, done.stderr[-3000:])
    stats = json.loads(_run(env, "stats", "--root", pg_url, "--json").stdout)
    assert stats["counts"]["completed"] == 1, stats
