"""DESIGN §4: "A lease is (job_id, token, owner, expires_at)". A lease built from those four
fields (a holder that kept its lease elsewhere, a test forging a stale one) is used like
the one `claim` returned: fenced by its token. It raised TypeError (a required `job`), and
built with job=None every call failed with AttributeError, on both stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool import JobState, Lease, LeaseLost
from tests.spools import make_spool


def test_a_lease_of_four_fields_holding_the_current_token_settles(
        store_root: str | Path) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue("k", {"a": 1}, job_id="x1")
        [real] = spool.claim(kinds="k", lease_seconds=30)
        kept = Lease(real.job_id, real.token, real.owner, real.expires_at)
        extended = spool.heartbeat(kept)
        assert extended.token == real.token and extended.job.payload == {"a": 1}
        assert isinstance(spool.check_leases([kept])[0], Lease)
        with spool.fenced(kept):
            pass
        done = spool.complete(kept, {"ok": True})
        assert (done.state, done.result) == (JobState.COMPLETED, {"ok": True})


@pytest.mark.parametrize("op", ["heartbeat", "complete", "fail", "release", "fenced"])
def test_a_forged_lease_of_four_fields_is_fenced(store_root: str | Path, op: str) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue("k", {"a": 1}, job_id="x1")
        [first] = spool.claim(kinds="k", lease_seconds=0.05)
        spool.release(first)
        [real] = spool.claim(kinds="k", lease_seconds=30)
        stale = Lease("x1", first.token, first.owner, first.expires_at)
        before = spool.get("x1")
        with pytest.raises(LeaseLost):
            if op == "fail":
                spool.fail(stale, "no")
            elif op == "fenced":
                with spool.fenced(stale):
                    pass
            else:
                getattr(spool, op)(stale)
        after = spool.get("x1")
        assert after is not None and before is not None
        assert (after.state, after.revision) == (JobState.LEASED, before.revision)
        missing = Lease("nope", real.token, real.owner, real.expires_at)
        with pytest.raises(LeaseLost):
            spool.complete(missing)
        assert [type(x).__name__ for x in spool.complete_many([(stale, None)])] == ["LeaseLost"]
        kept = Lease("x1", real.token, real.owner, real.expires_at)
        [done] = spool.complete_many([(kept, 1)])
        assert not isinstance(done, Exception) and done.result == 1


def test_in_a_batch_a_four_field_lease_of_no_job_gets_its_own_lease_lost(
        store_root: str | Path) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue("k", {}, job_id="x1")
        [real] = spool.claim(kinds="k", lease_seconds=30)
        ghost = Lease("nope", 999, "o", real.expires_at)
        beats = spool.heartbeat_many([real, ghost])
        assert isinstance(beats[0], Lease) and isinstance(beats[1], LeaseLost)
        checks = spool.check_leases([ghost, real])
        assert isinstance(checks[0], LeaseLost) and isinstance(checks[1], Lease)
        done = spool.complete_many([(ghost, None), (real, {"ok": 1})])
        assert isinstance(done[0], LeaseLost)
        assert not isinstance(done[1], Exception) and done[1].result == {"ok": 1}


def test_a_four_field_lease_of_the_current_token_under_another_owner_is_lost(
        store_root: str | Path) -> None:
    """Another spool's lease (its tokens count apart) names this job's token by chance: the
    owner, one of DESIGN's four fields, tells them apart."""
    with make_spool(store_root) as spool:
        spool.enqueue("k", {}, job_id="x1")
        [real] = spool.claim(kinds="k", owner="worker-B", lease_seconds=30)
        other = Lease("x1", real.token, "worker-A", real.expires_at)
        for call in (spool.heartbeat, spool.complete):
            with pytest.raises(LeaseLost, match="held by 'worker-B'"):
                call(other)
        assert spool.get("x1").state is JobState.LEASED  # type: ignore[union-attr]


def test_a_lease_with_a_token_above_the_jobs_is_not_said_to_be_claimed_again(
        store_root: str | Path) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue("k", {}, job_id="x1")
        [real] = spool.claim(kinds="k", lease_seconds=30)
        ahead = Lease("x1", real.token + 1, real.owner, real.expires_at)
        with pytest.raises(LeaseLost, match="above the job's lease") as info:
            spool.complete(ahead, 1)
        assert "claimed again" not in str(info.value)
        behind = Lease("x1", real.token - 1, real.owner, real.expires_at)
        with pytest.raises(LeaseLost, match="claimed again"):
            spool.complete(behind, 1)
