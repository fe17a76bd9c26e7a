"""A lease issued by another spool is refused on both stores (DESIGN §4), whatever the call.

Tokens are unique per spool only: two spools (per-tenant directories, or PostgreSQL
schemas) hand out the same tokens, and jobs of the same id are common (deterministic
ids). Found by an API probe (2026-12-04): on PostgreSQL, whose guard matched id and token
alone, spool B completed its job with spool A's lease, and B's real holder then lost it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Lease, Spool
from jobspool.errors import LeaseLost
from tests.pgserver import drop_schema, new_schema
from tests.spools import make_spool
from tests.store_params import STORES


@pytest.fixture(params=STORES)
def two_spools(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Spool, Spool]]:
    """Two independent spools of one store: two directories, or two schemas."""
    if request.param == "file":
        a, b = make_spool(tmp_path / "a"), make_spool(tmp_path / "b")
        yield a, b
        a.close()
        b.close()
        return
    server = request.getfixturevalue("pg_server")
    (sa, ua), (sb, ub) = new_schema(server.url), new_schema(server.url)
    a, b = make_spool(ua), make_spool(ub)
    yield a, b
    a.close()
    b.close()
    drop_schema(server.url, sa)
    drop_schema(server.url, sb)


CALLS: dict[str, Callable[[Spool, Lease], Any]] = {
    "complete": lambda s, lease: s.complete(lease, "wrong"),
    "complete_many": lambda s, lease: s.complete_many([(lease, "wrong")])[0],
    "fail": lambda s, lease: s.fail(lease, "wrong"),
    "release": lambda s, lease: s.release(lease),
    "heartbeat": lambda s, lease: s.heartbeat(lease),
    "check_leases": lambda s, lease: s.check_leases([lease])[0],
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_lease_of_another_spool_changes_nothing(two_spools: tuple[Spool, Spool],
                                                  call: str) -> None:
    a, b = two_spools
    a.enqueue("k", job_id="x")
    b.enqueue("k", job_id="x")
    (from_a,) = a.claim()
    (from_b,) = b.claim()
    assert from_a.token == from_b.token  # what makes it possible
    before = b.get("x")
    try:
        got = CALLS[call](b, from_a)
    except LeaseLost as exc:
        got = exc
    assert isinstance(got, LeaseLost), got
    assert "another spool" in str(got)
    assert b.get("x") == before  # nothing written, not even a heartbeat
    done = b.complete(from_b, "right")  # B's own holder still holds it
    assert done.state is JobState.COMPLETED and done.result == "right"


def test_a_lease_on_a_pruned_and_recreated_id_gives_one_reason_on_both_stores(
        two_spools: tuple[Spool, Spool]) -> None:
    """An old lease on an id whose job was pruned and enqueued again (the same spool):
    the file store said "job is ready", PostgreSQL "issued by another spool?"."""
    spool, _ = two_spools
    spool.enqueue("k", job_id="j")
    (old,) = spool.claim(lease_seconds=60)
    spool.complete(old)
    spool.prune(keep=0)
    spool.enqueue("k", job_id="j")
    with pytest.raises(LeaseLost, match="job is ready"):
        spool.complete(old)
    assert spool.get("j").state is JobState.READY
