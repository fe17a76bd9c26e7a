"""Audit of issue 13: the overview shows what `stats --json` counts, delayed jobs included
(`scheduled`: they sit in retryable/ until due, and were folded into `retryable`)."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.testclient import TestClient

from jobspool.dashboard import create_app
from tests.spools import make_spool


def test_the_overview_counts_scheduled_jobs_as_stats_does(tmp_path: Path) -> None:
    with make_spool(tmp_path / "spool") as spool:
        spool.enqueue("mail", {}, delay=600)
        spool.enqueue("mail", {}, delay=900)
        spool.enqueue("mail", {})
        stats = spool.stats().to_dict()
        client = TestClient(create_app(spool), base_url="http://127.0.0.1")
        doc = client.get("/api/overview").json()
        page = client.get("/").text
    assert stats["scheduled"] == 2
    assert (doc["scheduled"], doc["due"], doc["counts"]) == (2, 1, stats["counts"])
    shown = re.search(r'data-field="scheduled">(\d+)<', page)
    assert shown is not None and shown.group(1) == "2"
