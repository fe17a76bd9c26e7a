"""`jobspool fsck` on PostgreSQL (issue 16: it checks the invariants that apply): a fence
sequence set back below a token a job holds (a restored sequence, a hand edit) is reported,
with exit 2, because tokens could then be issued twice."""

from __future__ import annotations

import orjson
import psycopg

from tests.cli_harness import Result, run_jobspool
from tests.spools import make_spool


def _fsck(url: str) -> Result:
    return run_jobspool("fsck", "--json", root=url)


def test_fsck_reports_a_fence_sequence_behind_a_held_token(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue_many("note", [1, 2, 3])
        leases = spool.claim(limit=3)
    healthy = _fsck(pg_url)
    assert healthy.returncode == 0, healthy.stderr
    assert orjson.loads(healthy.stdout)["ok"] is True
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT setval('jobspool_fence', 1)")
    broken = _fsck(pg_url)
    assert broken.returncode == 2, broken.stderr
    doc = orjson.loads(broken.stdout)
    assert doc["ok"] is False
    assert any(str(max(x.token for x in leases)) in p for p in doc["problems"]), doc


def test_recover_raises_the_fence_sequence_above_every_token_a_row_holds(pg_url: str) -> None:
    """As the file spool's recover raises its fence: after a sequence set back (a restore,
    a hand edit), claims must not hand out a token a row already holds."""
    with make_spool(pg_url) as spool:
        spool.enqueue_many("note", [1, 2, 3], job_ids=["a", "b", "c"])
        leases = spool.claim(limit=3)
        top = max(x.token for x in leases)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT setval('jobspool_fence', 1)")
        report = spool.recover()
        assert report.fence_before == 1 and report.fence_after is not None
        assert report.fence_after > top
        assert report.fence_raised == tuple(x.job_id for x in leases if x.token > 1)
        spool.enqueue("note", job_id="d")
        (after,) = spool.claim()
        assert after.token > top
    assert _fsck(pg_url).returncode == 0


def test_claims_between_reading_the_fence_and_the_tokens_are_no_fence_behind(
        pg_url: str) -> None:
    # Found probing operations: with a worker claiming, `health` read the fence, then the
    # leased tokens, and took those drawn in between for tokens above the counter
    # (`fence_behind`, exit 2, "run recover") on a healthy database; `recover` raised the
    # sequence and warned of rows above it. The claims are made to land exactly there.
    with make_spool(pg_url) as spool, make_spool(pg_url) as other:
        spool.enqueue_many("note", list(range(9)))
        real = spool.fence_value
        calls = 0

        def fence_then_claims() -> int:
            nonlocal calls
            calls += 1
            value = real()
            if calls in (1, 4):  # health's first reading; recover's first after it
                other.claim(limit=3)  # another worker, right after the fence was read
            return value

        spool.fence_value = fence_then_claims  # type: ignore[method-assign]
        health = spool.health()
        assert not [r for r in health.reasons if r.code == "fence_behind"], health.reasons
        calls = 3
        report = spool.recover()
        assert report.fence_raised == ()
        assert calls > 4  # the claims did land between the readings
    assert _fsck(pg_url).returncode == 0
