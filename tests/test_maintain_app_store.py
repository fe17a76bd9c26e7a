"""`jobspool maintain --app` on an app whose projection is a `ProjectionStore` maintains
that store's tables: its `str()` was taken for a path, and the command said "no tables",
exit 0, for an app whose tables were there."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.cli_harness import run_jobspool


def test_maintain_app_with_a_projection_store(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    env = {"JOBSPOOL_TEST_PROJECTION": str(tmp_path / "index")}
    app = "tests.apps.store_projection:app"
    assert run_jobspool("init", root=root).code == 0
    for i in range(3):
        assert run_jobspool("enqueue", "doc", "--id", f"d{i}", root=root).code == 0
    ran = run_jobspool("run-until-idle", "--app", app, "--json", root=root, env=env)
    assert ran.code == 0, ran.err
    assert orjson.loads(ran.out)["completed"] == 3
    done = run_jobspool("maintain", "--app", app, "--json", root=root, env=env)
    assert done.code == 0, done.err
    report = orjson.loads(done.out)
    assert [t["table"] for t in report["tables"]] == ["docs"], report
