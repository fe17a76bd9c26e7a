"""`claim(exclude=...)` takes job ids: anything else is refused in one line, on both stores.

Before, a None among the ids made PostgreSQL's `NOT IN` unknown for every row (the claim
took nothing, for ever, silently), and a bare string was taken letter by letter.
"""

from __future__ import annotations

import pytest

from jobspool import Spool
from jobspool.errors import InvalidType


@pytest.mark.parametrize("exclude", [[None], ["a", 3], "a", 7, {"a": 1}])
def test_a_claim_excluding_what_is_not_job_ids_is_refused(any_spool: Spool,
                                                          exclude: object) -> None:
    any_spool.enqueue("k", {}, job_id="a")
    with pytest.raises(InvalidType, match="exclude"):
        any_spool.claim(exclude=exclude)  # type: ignore[arg-type]
    # Nothing was leased by the refused call: the job is still there to claim.
    [lease] = any_spool.claim()
    assert lease.job_id == "a"


def test_exclude_leaves_the_other_jobs_claimable(any_spool: Spool) -> None:
    for job_id in ("a", "b", "c"):
        any_spool.enqueue("k", {}, job_id=job_id)
    leases = any_spool.claim(limit=10, exclude=("b",))
    assert sorted(lease.job_id for lease in leases) == ["a", "c"]
