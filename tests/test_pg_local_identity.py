"""A database spool's workers are seen whatever URL names the database.

This machine's directory for a database spool (worker snapshots, progress) is named by
its URL: `health`, `stats --prometheus` and the dashboard opened with another spelling
of it (another role, as the README's read-only inspection advises; `?application_name=`)
looked in a directory of its own: `health --worker-stale` said ok with every worker
stuck, and the Prometheus output had no worker series. Each directory now records the
database it serves; readers take the snapshots of every directory serving theirs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from jobspool import Spool
from jobspool.metrics import publish_worker_report, read_worker_reports, render_prometheus
from jobspool.queue.report import RunReport
from tests.pgserver import new_schema


@pytest.fixture()
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JOBSPOOL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _spelled_otherwise(url: str) -> str:
    return url + ("&" if "?" in url else "?") + "application_name=monitor"


def test_a_monitor_url_sees_the_workers_of_another(pg_url: str, state_dir: Path) -> None:
    with Spool(pg_url) as workers, Spool(_spelled_otherwise(pg_url)) as monitor:
        assert workers.root != monitor.root  # two directories, as two URLs make
        workers.ensure_local_dir()  # what a Worker does at start
        publish_worker_report(workers, "w1", RunReport(completed=4))
        assert read_worker_reports(monitor)["w1"]["completed"] == 4
        assert 'jobspool_worker_completed_total{worker="w1"} 4.0' in render_prometheus(monitor)
        # Stuck: its snapshot goes stale; the monitor's health says so.
        path = workers.root / "metrics" / "w1.json"
        doc = orjson.loads(path.read_bytes())
        doc["written_at"] = time.time() - 600
        path.write_bytes(orjson.dumps(doc))
        os.utime(path, (time.time() - 600, time.time() - 600))
        health = monitor.health(worker_stale=60)
    assert "worker_stale" in health.codes(), health.to_dict()


def test_another_spool_in_the_same_database_is_not_mixed_in(pg_url: str, pg_server: object,
                                                            state_dir: Path) -> None:
    """Two spools in one database (a schema each) are two spools: their workers stay apart."""
    _, other_url = new_schema(pg_server.url)  # type: ignore[attr-defined]
    with Spool(pg_url) as one, Spool(other_url) as other:
        one.ensure_local_dir()
        other.ensure_local_dir()
        assert one.identity() and one.identity() != other.identity()
        publish_worker_report(one, "w-one", RunReport(completed=1))
        publish_worker_report(other, "w-other", RunReport(completed=2))
        assert set(read_worker_reports(one)) == {"w-one"}
        assert set(read_worker_reports(other)) == {"w-other"}
