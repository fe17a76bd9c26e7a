"""The command line on an s3:// projection: `--projection-option` reaches LanceDB (SeaweedFS)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobspool.projection.lance import LanceProjection
from tests.s3server import S3Server
from tests.subproc import cli_env

ROOT = Path(__file__).resolve().parent.parent


def test_run_until_idle_and_maintain_reach_s3_through_projection_options(
    s3_server: S3Server, tmp_path: Path
) -> None:
    (tmp_path / "s3cliapp.py").write_text(
        "from jobspool import App\n"
        "def note(job, ctx):\n    ctx.upsert('notes', {'id': job.payload['k'], 'n': job.payload['n']})\n"
        "app = App(handlers={'note': note})\n")
    uri, options = s3_server.uri("cli"), s3_server.options()
    env = cli_env(PYTHONPATH=f"{ROOT}:{tmp_path}")
    run = [sys.executable, "-m", "jobspool", "--root", str(tmp_path / "spool")]
    opts = ["--projection", uri]
    for k, v in options.items():
        opts += ["--projection-option", f"{k}={v}"]

    def jobspool(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*run, *args], env=env, capture_output=True, text=True, cwd=tmp_path,
                              timeout=180)

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
