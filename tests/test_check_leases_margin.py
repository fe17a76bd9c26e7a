"""`check_leases(margin=...)` on both stores: the margin is checked like every other length
of time, so a NaN (on which the file spool extended every lease and PostgreSQL none) or a
negative margin is refused, naming it, before any lease is touched (tests/store_params.py)."""

from __future__ import annotations

import pytest

from jobspool import Spool
from jobspool.errors import InvalidJob, LeaseLost


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, "5", True, None])
def test_a_margin_that_is_not_a_non_negative_finite_number_is_refused(
        any_spool: Spool, bad: object) -> None:
    any_spool.enqueue("k", job_id="a")
    (lease,) = any_spool.claim(lease_seconds=30)
    with pytest.raises(InvalidJob, match="margin"):
        any_spool.check_leases([lease], margin=bad)  # type: ignore[arg-type]
    job = any_spool.get("a")
    assert job.revision == lease.job.revision
    assert job.lease is not None and job.lease.expires_at == lease.expires_at


def test_a_lease_with_less_than_the_margin_left_is_extended_and_one_with_more_is_not(
        any_spool: Spool) -> None:
    any_spool.enqueue("k", job_id="a")
    (lease,) = any_spool.claim(lease_seconds=30)
    (kept,) = any_spool.check_leases([lease], margin=1.0)
    assert not isinstance(kept, LeaseLost) and kept.expires_at == lease.expires_at
    (extended,) = any_spool.check_leases([lease], margin=60.0, lease_seconds=120)
    assert not isinstance(extended, LeaseLost)
    assert extended.expires_at > lease.expires_at + 60
