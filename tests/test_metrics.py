"""Prometheus metrics: the exposition parsed back by prometheus_client's own parser."""

from __future__ import annotations

import dataclasses
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobspool import RunReport, Spool
from jobspool.metrics import (
    WORKER_COUNTERS,
    publish_worker_report,
    read_worker_reports,
    remove_worker_report,
    render_prometheus,
    serve_metrics,
)
from tests.conftest import FakeClock
from tests.spools import make_spool

Key = tuple[str, frozenset[tuple[str, str]]]


def parse(text: str) -> tuple[dict[Key, float], dict[str, str]]:
    """Samples by (name, labels), and each family's declared type."""
    samples: dict[Key, float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, types


def value(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def spool(spool_root: Path, clock: FakeClock) -> Iterator[Spool]:
    s = make_spool(spool_root, clock=clock, lease_seconds=10.0, max_attempts=5,
              retry_base_seconds=30.0, retry_max_seconds=30.0, seed=1)
    yield s
    s.close()


def test_counts_ages_fence_and_rescues_parse_back_with_the_expected_values(
        spool: Spool, clock: FakeClock, spool_root: Path) -> None:
    spool.enqueue("mail", job_id="m1")
    spool.enqueue("mail", job_id="m2")
    spool.enqueue("sms", job_id="s1")
    spool.enqueue("img", job_id="i1")
    (m1,) = spool.claim(kinds="mail")  # token 1
    spool.fail(m1, "try later")  # retryable, 1 attempt: a retry to come
    (s1,) = spool.claim(kinds="sms")  # token 2
    spool.fail(s1, "bad number", retryable=False)  # dead letter
    spool.claim(kinds="img")  # token 3
    clock.advance(10.0)  # img's worker died; m2 has waited 10 s
    spool.claim(kinds="img")  # token 4: rescued, second attempt
    (spool_root / "quarantine" / "123-1-0.ready.junk.json").write_bytes(b"{")

    samples, types = parse(render_prometheus(spool))

    def jobs(state: str, kind: str) -> float:
        return value(samples, "jobspool_jobs", state=state, kind=kind)

    assert jobs("ready", "mail") == 1 and jobs("retryable", "mail") == 1
    assert jobs("dead_letter", "sms") == 1 and jobs("leased", "img") == 1
    assert jobs("completed", "mail") == 0  # every state is present, zeros included
    assert sum(v for (n, _), v in samples.items() if n == "jobspool_jobs") == 4
    assert value(samples, "jobspool_due_jobs") == 1  # m2; m1 backs off for 30 s
    assert value(samples, "jobspool_oldest_due_age_seconds") == pytest.approx(10.0)
    assert value(samples, "jobspool_dead_letters") == 1
    assert value(samples, "jobspool_fence") == 4
    assert value(samples, "jobspool_quarantined_files") == 1
    assert value(samples, "jobspool_job_rescues", kind="img") == 1
    assert value(samples, "jobspool_job_rescues", kind="mail") == 0
    assert value(samples, "jobspool_job_retries", kind="img") == 1  # attempt 2 of the rescued job
    assert value(samples, "jobspool_job_retries", kind="mail") == 0  # the retry has not run yet
    assert types["jobspool_jobs"] == "gauge" and types["jobspool_job_rescues"] == "gauge"

    clock.advance(30.0)
    (m1,) = [lease for lease in spool.claim(kinds="mail", limit=2) if lease.job_id == "m1"]
    samples, _ = parse(render_prometheus(spool))
    assert value(samples, "jobspool_job_retries", kind="mail") == 1
    assert value(samples, "jobspool_fence") == 6


def test_an_empty_spool_exports_zeros_and_no_per_kind_series(spool: Spool) -> None:
    samples, types = parse(render_prometheus(spool))
    assert value(samples, "jobspool_due_jobs") == 0
    assert value(samples, "jobspool_oldest_due_age_seconds") == 0
    assert value(samples, "jobspool_dead_letters") == 0
    assert value(samples, "jobspool_fence") == 0
    assert not any(name == "jobspool_jobs" for name, _ in samples)
    assert "jobspool_worker_completed" not in types  # no worker published anything


def test_every_exported_worker_counter_is_a_run_report_field() -> None:
    names = {f.name for f in dataclasses.fields(RunReport)}
    assert set(WORKER_COUNTERS) <= names
    # Each tally of a run's jobs is exported: `interrupted` (runs a shutdown cut off) was
    # split from `released` and counted nowhere in the metrics.
    assert {"claimed", "completed", "retried", "dead_lettered", "lease_lost", "released",
            "interrupted"} <= set(WORKER_COUNTERS)


def test_published_worker_counters_appear_as_counters_until_stale(spool: Spool,
                                                                  spool_root: Path) -> None:
    owner = 'host "a"\\b:123'  # label values need escaping: the renderer does it
    publish_worker_report(spool, owner, RunReport(claimed=7, completed=5, retried=1,
                                                  dead_lettered=1, projected_rows=40))
    samples, types = parse(render_prometheus(spool))
    assert types["jobspool_worker_completed"] == "counter"
    assert value(samples, "jobspool_worker_completed_total", worker=owner) == 5
    assert value(samples, "jobspool_worker_claimed_total", worker=owner) == 7
    assert value(samples, "jobspool_worker_projected_rows_total", worker=owner) == 40
    assert value(samples, "jobspool_worker_lease_lost_total", worker=owner) == 0

    assert read_worker_reports(spool, now=time.time() + 3600) == {}  # a dead worker drops out
    (path,) = (spool_root / "metrics").iterdir()
    doc = orjson.loads(path.read_bytes())
    doc["written_at"] = time.time() - 3600
    path.write_bytes(orjson.dumps(doc))
    assert "jobspool_worker_completed" not in parse(render_prometheus(spool))[1]

    publish_worker_report(spool, owner, RunReport(completed=6))
    remove_worker_report(spool, owner)
    assert read_worker_reports(spool) == {}


def test_a_corrupt_worker_snapshot_is_skipped(spool: Spool, spool_root: Path) -> None:
    (spool_root / "metrics").mkdir()
    (spool_root / "metrics" / "x.json").write_bytes(b"not json")
    (spool_root / "metrics" / "y.json").write_bytes(b"[1, 2]")
    publish_worker_report(spool, "w1", RunReport(completed=2))
    assert set(read_worker_reports(spool)) == {"w1"}


# ---------------------------------------------------------------- the /metrics endpoint


class StubWorker:
    owner = "host:42:ab"

    def __init__(self) -> None:
        self.report: RunReport | None = RunReport(claimed=3, completed=2, retried=1)

    def live_report(self) -> RunReport | None:
        return self.report


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return str(resp.read().decode("utf-8"))


def test_the_endpoint_serves_spool_and_live_worker_metrics_then_frees_the_port(
        spool: Spool) -> None:
    spool.enqueue("mail")
    worker = StubWorker()
    server = serve_metrics(spool, "127.0.0.1", 0, worker, min_interval=0.0)
    try:
        assert server.host == "127.0.0.1"
        samples, _ = parse(get(f"http://127.0.0.1:{server.port}/metrics"))
        assert value(samples, "jobspool_jobs", state="ready", kind="mail") == 1
        assert value(samples, "jobspool_worker_completed_total", worker="host:42:ab") == 2
        worker.report = RunReport(claimed=3, completed=3, retried=1)
        spool.enqueue("mail")
        samples, _ = parse(get(f"http://127.0.0.1:{server.port}/metrics"))
        assert value(samples, "jobspool_worker_completed_total", worker="host:42:ab") == 3
        assert value(samples, "jobspool_jobs", state="ready", kind="mail") == 2
    finally:
        server.shutdown()
    with socket.socket() as s:  # shut down means the port is released
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))


def test_scrapes_within_min_interval_reuse_the_last_collection(spool: Spool) -> None:
    server = serve_metrics(spool, "127.0.0.1", 0, None, min_interval=3600.0)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert value(parse(get(url))[0], "jobspool_due_jobs") == 0
        spool.enqueue("mail")
        assert value(parse(get(url))[0], "jobspool_due_jobs") == 0
    finally:
        server.shutdown()


def test_a_port_in_use_raises_oserror(spool: Spool) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            serve_metrics(spool, "127.0.0.1", port, None)


def test_an_unreadable_job_file_is_skipped_with_a_warning_not_a_crash(
        spool: Spool, spool_root: Path) -> None:
    from jobspool.errors import CorruptFileWarning

    spool.enqueue("mail")
    (spool_root / "ready" / "broken.json").write_bytes(b"{")
    with pytest.warns(CorruptFileWarning):
        samples, _ = parse(render_prometheus(spool))
    assert value(samples, "jobspool_jobs", state="ready", kind="mail") == 1


def test_a_scrape_of_a_spool_that_cannot_be_read_is_a_one_line_503(
        spool: Spool, spool_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A state directory moved away under a worker: a bare 500 and a traceback on the
    worker's stderr at every scrape (an HTTP probe). Then, put back, it serves again."""
    import logging
    import urllib.error
    import urllib.request

    spool.enqueue("mail")
    server = serve_metrics(spool, "127.0.0.1", 0, None, min_interval=0.0)
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        (spool_root / "dead_letter").rename(spool_root / "dead_letter.x")
        caplog.set_level(logging.WARNING, logger="jobspool")
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(url, timeout=10)
        assert failed.value.code == 503
        body = failed.value.read().decode()
        assert body.count("\n") == 1 and "dead_letter" in body, body
        assert [r for r in caplog.records if "metrics scrape failed" in r.getMessage()]
        (spool_root / "dead_letter.x").rename(spool_root / "dead_letter")
        assert value(parse(get(url))[0], "jobspool_due_jobs") == 1
    finally:
        server.shutdown()


def test_owners_that_clean_to_one_file_name_keep_their_own_snapshots(spool: Spool) -> None:
    # Found in an observability probe: `team/a` and `team_a` shared `team_a.json`, so one
    # worker's counters hid the other's (the dashboard counted 115 of 240 completions),
    # and the first to exit deleted the other's live snapshot.
    publish_worker_report(spool, "team/a", RunReport(completed=3))
    publish_worker_report(spool, "team_a", RunReport(completed=5))
    publish_worker_report(spool, 'team/a "x"\\y', RunReport(completed=7))
    reports = read_worker_reports(spool)
    assert {o: r["completed"] for o, r in reports.items()} == {
        "team/a": 3, "team_a": 5, 'team/a "x"\\y': 7}
    remove_worker_report(spool, "team/a")
    assert set(read_worker_reports(spool)) == {"team_a", 'team/a "x"\\y'}
