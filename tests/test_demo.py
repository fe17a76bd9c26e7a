"""`jobspool demo`: a realistic batch through two worker processes into LanceDB.

Run as a user would, through a subprocess, with `--jobs 200` to stay small.
The report is checked against the spool and the LanceDB table read
independently, and the commands it suggests are run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState
from tests.cli_harness import run_jobspool
from tests.helpers_spool import job_files
from tests.spools import make_spool

pytestmark = pytest.mark.slow

JOBS = 200
POISON = f"doc-{JOBS // 2:05d}"  # the demo's one deliberately broken document


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("demo") / "spool"
    done = run_jobspool("--root", root, "demo", "--jobs", str(JOBS), "--json")
    err = done.stderr
    assert done.returncode == 0, err
    assert "Traceback" not in err, err
    return root, orjson.loads(done.stdout)


def test_demo_reports_what_happened_as_one_json_document(demo: tuple[Path, dict[str, Any]]
                                                         ) -> None:
    root, doc = demo
    assert Path(doc["root"]) == root
    assert doc["jobs"] == JOBS
    assert doc["workers"] == 2
    assert len(doc["per_worker"]) == 2
    totals = doc["totals"]
    assert totals["completed"] == JOBS - 1
    assert totals["dead_lettered"] == 1
    assert totals["lease_lost"] == 0
    assert totals["retried"] >= 2  # the flaky document asks twice before it succeeds
    assert totals["claimed"] == totals["completed"] + totals["retried"] + totals["dead_lettered"]
    assert sum(w["completed"] for w in doc["per_worker"]) == JOBS - 1
    assert doc["counts"]["completed"] == JOBS - 1
    assert doc["counts"]["dead_letter"] == 1
    assert sum(doc["counts"].values()) == JOBS
    assert len(doc["retried_jobs"]) >= 1
    (dead,) = doc["dead_letters"]
    assert "deliberately" in dead["error"]
    assert doc["table_rows"] == JOBS - 1
    assert doc["sample_row"]["id"] == "doc-00042"


def test_demo_leaves_a_spool_the_report_agrees_with(demo: tuple[Path, dict[str, Any]]) -> None:
    root, doc = demo
    on_disk = job_files(root)
    assert len(on_disk) == JOBS
    where = [w for ws in on_disk.values() for w in ws]
    assert where.count("completed") == JOBS - 1
    assert where.count("dead_letter") == 1
    assert len(where) == JOBS  # one file per job, nothing left leased or duplicated
    with make_spool(root, create=False) as spool:
        (dead,) = spool.jobs(state=JobState.DEAD_LETTER)
        assert dead.id == doc["dead_letters"][0]["id"]
        assert dead.payload["doc_id"] == POISON
        assert dead.attempts == 1  # Fail dead-letters at once
        for job_id in doc["retried_jobs"]:
            job = spool.get(job_id)
            assert job.state is JobState.COMPLETED
            assert job.attempts == 3
        assert spool.fsck().ok


def test_demo_projects_every_good_document_into_lancedb(demo: tuple[Path, dict[str, Any]]
                                                        ) -> None:
    from jobspool.projection.lance import LanceProjection

    _, doc = demo
    assert Path(doc["projection"]).is_dir()
    table = LanceProjection(doc["projection"], "docs")
    try:
        assert table.count() == JOBS - 1
        assert table.get(POISON) is None
        row = table.get("doc-00042")
        assert row is not None
        assert row["title"].startswith("note 42")
        assert row["words"] >= 20
        ids = set(table.to_arrow(columns=["id"]).column("id").to_pylist())
        assert ids == {f"doc-{i:05d}" for i in range(JOBS)} - {POISON}
    finally:
        table.store.close()


def test_the_commands_the_demo_suggests_work(demo: tuple[Path, dict[str, Any]]) -> None:
    root, doc = demo
    dead_id = doc["dead_letters"][0]["id"]
    shown = run_jobspool("--root", root, "show", dead_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["state"] == "dead_letter"
    stats = run_jobspool("--root", root, "stats")
    assert stats.returncode == 0
    assert "dead_letter" in stats.stdout


def test_demo_text_output_in_a_fresh_temporary_spool(tmp_path: Path) -> None:
    """The README's first command: no --root, human output that says where things are."""
    done = run_jobspool("demo", "--jobs", "60", env={"TMPDIR": str(tmp_path)})
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    made = [p for p in tmp_path.iterdir() if p.name.startswith("jobspool-demo-")]
    assert len(made) == 1
    root = made[0] / "spool"
    assert str(root) in out
    assert "dead letter" in out
    assert "LanceDB" in out
    with make_spool(root, create=False) as spool:
        counts = spool.stats().counts
    assert counts["completed"] == 59
    assert counts["dead_letter"] == 1


def test_demo_logging_json_ends_with_a_summary_event_not_text(tmp_path: Path) -> None:
    """README: with --log-format json the final summary is an "event": "summary" line on
    stderr, not text on stdout (as for worker and run-until-idle)."""
    import orjson

    done = run_jobspool("--root", tmp_path / "spool", "demo", "--jobs", "20",
                        "--log-format", "json")
    assert done.code == 0, done.err
    assert done.out == ""
    events = [orjson.loads(line) for line in done.err.splitlines() if line.startswith("{")]
    summaries = [e for e in events if e.get("event") == "summary"]
    assert len(summaries) == 1 and summaries[0]["summary"]["jobs"] == 20
