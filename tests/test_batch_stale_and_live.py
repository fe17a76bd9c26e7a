"""A batch holding a stale lease and the live lease of the same job, and hand-built leases
with a token of the wrong type: both stores answer alike (a differential probe).

On PostgreSQL, `check_leases` keyed its answer by job id, so the stale lease beside the
live one passed for current; `complete_many`/`fail_many` refused the live lease after a
stale one as "settled twice in one batch" and the job ran again. A token given as text or
a float failed with a raw TypeError on the file store and was settled, or refused in SQL,
on PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from jobspool import JobState, Spool
from jobspool.errors import InvalidType, LeaseLost
from jobspool.queue.job import Lease

Batch = Callable[[Spool, list[Lease]], list[object]]
BATCHES: dict[str, Batch] = {
    "check_leases": lambda s, ls: list(s.check_leases(ls)),
    "heartbeat_many": lambda s, ls: list(s.heartbeat_many(ls)),
    "complete_many": lambda s, ls: list(s.complete_many([(lease, "r") for lease in ls])),
    "fail_many": lambda s, ls: list(s.fail_many([(lease, "e", True, None) for lease in ls])),
}
AFTER = {"check_leases": JobState.LEASED, "heartbeat_many": JobState.LEASED,
         "complete_many": JobState.COMPLETED, "fail_many": JobState.RETRYABLE}


def _stale_and_live(spool: Spool) -> tuple[Lease, Lease]:
    spool.enqueue("a", {}, job_id="x")
    (stale,) = spool.claim(limit=1, lease_seconds=0.05)
    time.sleep(0.15)
    (live,) = spool.claim(limit=1, lease_seconds=600)
    assert (stale.job_id, live.job_id) == ("x", "x") and live.token > stale.token
    return stale, live


@pytest.mark.parametrize("order", ["stale_first", "live_first"])
@pytest.mark.parametrize("call", sorted(BATCHES))
def test_the_live_lease_wins_and_the_stale_one_is_lost_whatever_the_order(
        make_any_spool: Callable[..., Spool], call: str, order: str) -> None:
    spool = make_any_spool(retry_base_seconds=1000.0, retry_max_seconds=2000.0)
    stale, live = _stale_and_live(spool)
    batch = [stale, live] if order == "stale_first" else [live, stale]
    out = dict(zip((id(x) for x in batch), BATCHES[call](spool, batch), strict=True))
    assert isinstance(out[id(stale)], LeaseLost)
    if order == "stale_first":  # after the live one settled, the job moved on anyway
        assert "claimed again" in str(out[id(stale)])
    assert not isinstance(out[id(live)], LeaseLost), out[id(live)]
    assert spool.get("x").state is AFTER[call]


@pytest.mark.parametrize("token", ["1", 1.0, None, True, 2**64])
def test_a_hand_built_lease_with_a_token_of_the_wrong_type_is_refused_in_one_line(
        make_any_spool: Callable[..., Spool], token: object) -> None:
    spool = make_any_spool()
    spool.enqueue("a", {}, job_id="x")
    (lease,) = spool.claim(limit=1)
    forged = Lease("x", token, lease.owner, lease.expires_at)  # type: ignore[arg-type]
    for call in (lambda: spool.complete(forged, "r"), lambda: spool.heartbeat(forged),
                 lambda: spool.fail(forged, "e"), lambda: spool.release(forged)):
        with pytest.raises(InvalidType, match=r"Lease\.token must be the claim's token"):
            call()
    assert spool.get("x").state is JobState.LEASED
    spool.complete(Lease("x", lease.token, lease.owner, lease.expires_at), "ok")
    assert spool.get("x").result == "ok"
