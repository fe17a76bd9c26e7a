"""The overview with many leases: a bounded list per worker, the total beside it.

Every lease of every worker went out on each refresh of the overview (608 KB at 6,000
leases, once a second per open page) for a page that shows four per worker.
"""

from __future__ import annotations

import time

from starlette.testclient import TestClient

from jobspool import Spool
from jobspool.dashboard import create_app
from jobspool.dashboard.data import RUNNING_SHOWN
from tests.spools import SpoolFactory


def test_overview_lists_a_bounded_share_of_the_leases_and_counts_them_all(
        make_spool: SpoolFactory) -> None:
    spool: Spool = make_spool()
    total = RUNNING_SHOWN + 10
    spool.enqueue_many("k", [{"i": i} for i in range(total)])
    short = spool.claim(limit=2, owner="w1", lease_seconds=0.01)
    rest = spool.claim(limit=total - 2, owner="w1", lease_seconds=600)
    assert len(short) + len(rest) == total
    time.sleep(0.05)  # the two short leases expire
    client = TestClient(create_app(spool), base_url="http://127.0.0.1")  # type: ignore[arg-type]
    with client:
        doc = client.get("/api/overview").json()
        page = client.get("/").text
    (worker,) = [w for w in doc["workers"] if w["owner"] == "w1"]
    assert worker["running_total"] == total
    assert worker["running_expired"] == 2
    assert len(worker["running"]) == RUNNING_SHOWN
    # The expired ones first: what an operator looks for.
    assert {r["id"] for r in worker["running"][:2]} == {lease.job_id for lease in short}
    assert all(r["expired"] for r in worker["running"][:2])
    assert f"and {total - 4} more leased" in page
