"""The dashboard's overview answers while another process holds the spool lock: health
says `lock_held` within its bound, and the counts are the last ones read (`counts_as_of`).

Found by a probe: `/api/overview` took 49.7 s behind a 50 s `flock` on `.lock`, never showed
`lock_held` (which `jobspool health` answered in 5.3 s), and then served the same frozen
document for as long again, a result being kept "as long as it took to compute"."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from jobspool import Spool
from jobspool.dashboard.data import Overview
from tests.lock_holder import holding_lock


def test_the_overview_says_lock_held_and_shows_the_last_counts(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root) as spool:
        spool.enqueue_many("k", [{"i": i} for i in range(3)])
        overview = Overview(spool)
        before = overview.snapshot()
        assert before["health"]["status"] == "ok"
        assert before["counts"]["ready"] == 3
        with holding_lock(root, seconds=120, directory_only=True):
            held = overview.snapshot()
        assert [r["code"] for r in held["health"]["reasons"]] == ["lock_held"]
        assert held["counts"]["ready"] == 3  # the last counts read
        assert held["counts_as_of"] == before["counts_as_of"] < held["now"]
        after = overview.snapshot()  # let go: counted afresh
        assert after["health"]["status"] == "ok"
        assert after["counts_as_of"] > before["counts_as_of"]


def test_a_slow_overview_is_not_served_frozen_for_as_long_as_it_took(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jobspool.dashboard import web

    clock = [1000.0]
    monkeypatch.setattr(web.time, "monotonic", lambda: clock[0])
    computed: list[float] = []

    class SlowOverview:
        def snapshot(self, throughput: Any) -> dict[str, Any]:
            computed.append(clock[0])
            clock[0] += 50.0  # waited 50 s for a held spool lock
            return {"n": len(computed)}

    class NoThroughput:
        def series(self) -> dict[str, Any]:
            return {}

    dash = object.__new__(web.Dashboard)  # only what `snapshot` reads
    dash.read_only = False
    dash.overview = SlowOverview()  # type: ignore[assignment]
    dash.throughput = NoThroughput()  # type: ignore[assignment]
    dash._cached = None
    dash._computing = threading.Lock()
    assert dash.snapshot()["n"] == 1
    clock[0] += 5.0
    assert dash.snapshot()["n"] == 1  # a few seconds on: the same document
    clock[0] += 10.0
    assert dash.snapshot()["n"] == 2  # 15 s on: computed again, not served for 50 s
