"""Storage options from the command line and an App: `--projection-option` reaches LanceDB (SeaweedFS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobspool.errors import ConfigError
from jobspool.projection.lance import LanceProjection
from jobspool.queue.worker import Worker
from tests.cli_harness import Result, run_jobspool
from tests.s3server import S3Server
from tests.spools import make_spool

ROOT = Path(__file__).resolve().parent.parent


def _note(job: Any, ctx: Any) -> None:
    ctx.upsert("notes", {"id": job.payload["k"]})


def _projection_flags(uri: str, options: dict[str, str]) -> list[str]:
    """`--projection URI` and a `--projection-option KEY=VALUE` per storage option."""
    return ["--projection", uri, *(flag for k, v in options.items()
                                   for flag in ("--projection-option", f"{k}={v}"))]


def test_run_until_idle_and_maintain_reach_s3_through_projection_options(
    s3_server: S3Server, tmp_path: Path
) -> None:
    (tmp_path / "s3cliapp.py").write_text(
        "from jobspool import App\n"
        "def note(job, ctx):\n    ctx.upsert('notes', {'id': job.payload['k'], 'n': job.payload['n']})\n"
        "app = App(handlers={'note': note})\n")
    uri, options = s3_server.uri("cli"), s3_server.options()
    opts = _projection_flags(uri, options)

    def jobspool(*args: str) -> Result:
        return run_jobspool(*args, root=tmp_path / "spool", env={"PYTHONPATH": f"{ROOT}:{tmp_path}"},
                            cwd=tmp_path, timeout=180)

    assert jobspool("init").returncode == 0
    for n in range(3):
        assert jobspool("enqueue", "note", f'{{"k": "k{n}", "n": {n}}}').returncode == 0
    done = jobspool("run-until-idle", "--app", "s3cliapp:app", *opts)
    assert done.returncode == 0, done.stderr
    rows = LanceProjection(uri, "notes", storage_options=options).to_arrow().to_pylist()
    assert sorted((r["id"], r["n"]) for r in rows) == [("k0", 0), ("k1", 1), ("k2", 2)]
    maintained = jobspool("maintain", "--json", *opts)
    assert maintained.returncode == 0, maintained.stderr
    assert '"optimized"' in maintained.stdout


# --- the options' way in: App, CLI flags, a pool's children


def test_an_apps_storage_options_reach_its_worker_and_flags_override_them_key_by_key(tmp_path: Path) -> None:
    from jobspool import App
    from jobspool.cli.objectstore import storage_options
    from jobspool.cli.parser import build_parser
    from jobspool.cli.pool import _child_options

    app = App(handlers={"note": _note}, projection="s3://b/p", storage_options={"aws_region": "a", "x": "1"})
    with make_spool(tmp_path / "spool") as spool:
        assert Worker(spool, app).storage_options == {"aws_region": "a", "x": "1"}
        assert Worker(spool, app, storage_options={"y": "2"}).storage_options == {"y": "2"}
    args = build_parser().parse_args(["worker", "--app", "m:a", "--processes", "2",
                                      "--projection-option", "aws_region=b",
                                      "--projection-option", "allow_http=true"])
    assert storage_options(args, app.storage_options) == {"aws_region": "b", "x": "1", "allow_http": "true"}
    assert "--projection-option" not in _child_options(args)  # by the environment: below
    with pytest.raises(ConfigError, match="storage option 'n' must be a string"):
        App(handlers={"note": _note}, storage_options={"n": 1})  # type: ignore[dict-item]


def test_a_pools_children_get_the_projection_options_without_showing_them_in_ps(
    s3_server: S3Server, tmp_path: Path
) -> None:
    # The options went on each child's command line: a secret key was in `ps` for every
    # local user. They go by the environment now, and out of it before any handler runs.
    import os
    import signal
    import time

    from tests.cli_harness import start_jobspool

    (tmp_path / "s3poolapp.py").write_text(
        "import os\n"
        "from jobspool import App\n"
        "def note(job, ctx):\n"
        "    ctx.upsert('notes', {'id': job.payload['k']})\n"
        "    return {'argv': open('/proc/self/cmdline').read(),\n"
        "            'env': sorted(k for k in os.environ if 'PROJECTION' in k)}\n"
        "app = App(handlers={'note': note})\n")
    uri, options = s3_server.uri("pool"), s3_server.options()
    opts = _projection_flags(uri, options)
    env = {"PYTHONPATH": f"{ROOT}:{tmp_path}"}
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        ids = [spool.enqueue("note", {"k": f"k{n}"}).id for n in range(4)]
        pool = start_jobspool("worker", "--processes", "2", "--app", "s3poolapp:app", *opts,
                              root=root, env=env, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 120
            while any(spool.get(i).state.value != "completed" for i in ids):
                assert pool.poll() is None, pool.communicate()
                assert time.monotonic() < deadline, [spool.get(i) for i in ids]
                time.sleep(0.1)
        finally:
            os.kill(pool.pid, signal.SIGTERM)
            pool.communicate(timeout=60)
        results = [spool.get(i).result for i in ids]
    assert all(options["aws_secret_access_key"] not in r["argv"] for r in results), results
    assert [r["env"] for r in results] == [[]] * 4
    rows = LanceProjection(uri, "notes", storage_options=options).to_arrow().to_pylist()
    assert sorted(r["id"] for r in rows) == ["k0", "k1", "k2", "k3"]
