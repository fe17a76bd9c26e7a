"""A worker's claims: never past its cap, in two sizes only; PostgreSQL plans a claim once.

A settle running beside the loop forgot part of its group before counting it out, so the
pipeline saw fewer than zero jobs unfinished and claimed `cap - unfinished`: up to five
batches at once. And PostgreSQL planned every claim afresh (~0.5-0.9 ms each): bound, the
limit made the generic plan look costlier than the custom ones.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from jobspool import Spool, Worker


def _recording_claims(spool: Spool) -> collections.Counter[int]:
    limits: collections.Counter[int] = collections.Counter()
    claim = spool.claim

    def recorded(**kwargs: Any) -> Any:
        limits[kwargs["limit"]] += 1
        return claim(**kwargs)

    spool.claim = recorded  # type: ignore[method-assign]
    return limits


def test_a_worker_claims_a_full_batch_or_half_of_one_never_more(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    for k in range(0, 2000, 100):
        spool.enqueue_many("k", [{"i": i} for i in range(k, k + 100)])
    limits = _recording_claims(spool)
    report = Worker(spool, handlers={"k": lambda job, ctx: None}, batch_size=10).run_until_idle()
    assert report.completed == 2000
    assert set(limits) <= {10, 5}, limits
    assert limits[10] > 0


def test_a_prepared_claim_keeps_one_generic_plan_on_postgresql(pg_url: str) -> None:
    with Spool(pg_url) as spool:
        # Deep enough that a plan for 10% of the waiting jobs (the server's guess for a bound
        # limit) costs more than one for 50.
        for k in range(0, 20000, 1000):
            spool.enqueue_many("k", [{"i": i} for i in range(k, k + 1000)])
        spool.db.run(lambda c: c.execute("ANALYZE jobspool_jobs"), what="analyze")  # type: ignore[attr-defined]
        for _ in range(40):
            leases = spool.claim(kinds="k", limit=50, lease_seconds=60)
            spool.complete_many([(lease, None) for lease in leases])

        def plans(conn: Any) -> list[tuple[int, int]]:
            rows = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%%WITH due AS MATERIALIZED%%'").fetchall()
            return [(int(g), int(c)) for g, c in rows]

        found = spool.db.run(plans, what="plans")  # type: ignore[attr-defined]
    assert found, "the claim was never prepared"
    generic, custom = map(sum, zip(*found, strict=True))
    assert generic >= 30 and custom <= 5, found
