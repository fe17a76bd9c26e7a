"""Several tabs polling `/api/overview` at once share one computation of it. On a big
spool one took seconds and each request made its own: they piled up (six at once took 13 s
each, a scale probe) and the dashboard's memory grew with them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from jobspool.dashboard import create_app
from jobspool.dashboard.data import Overview
from tests.spools import make_spool

LOCAL = "http://127.0.0.1"


def test_concurrent_overview_requests_share_one_computation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Overview.snapshot
    calls: list[float] = []

    def slow(self: Overview, *args: object, **kwargs: object) -> object:
        calls.append(time.monotonic())
        time.sleep(0.5)  # a big spool's computation, long enough for the others to arrive
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Overview, "snapshot", slow)
    with make_spool(tmp_path / "s") as spool:
        spool.enqueue("mail", {})
        with TestClient(create_app(spool), base_url=LOCAL) as client:  # type: ignore[arg-type]
            codes: list[int] = []
            threads = [threading.Thread(target=lambda: codes.append(
                client.get("/api/overview").status_code)) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
    assert codes == [200] * 6
    assert len(calls) == 1, calls
