"""A ready job is due whatever its `run_at` says, on both stores (the file spool's
`machine.is_due`). On PostgreSQL a producer stamps `run_at` from its estimate of the
database's clock, measured when it opened; one whose estimate ran ahead (the database
clock stepped back, a failover to a server behind) wrote ready jobs no claim took until
the database's clock caught up, while `stats` said "due now" and `health` said ok."""

from __future__ import annotations

import time

import pytest

from tests.spools import make_spool


@pytest.mark.parametrize("store", ["file", "pg"])
def test_a_ready_job_stamped_ahead_is_claimed_now(store: str, tmp_path: object,
                                                  request: pytest.FixtureRequest) -> None:
    root = str(tmp_path) if store == "file" else request.getfixturevalue("pg_url")
    with make_spool(root, clock=lambda: time.time() + 3600) as ahead:
        job = ahead.enqueue("k", {"i": 1})
    assert job.state.value == "ready" and job.run_at > time.time() + 3000
    with make_spool(root) as spool:  # the real clock (on PostgreSQL, the database's)
        assert spool.stats().due == 1
        leases = spool.claim(limit=5)
        assert [lease.job_id for lease in leases] == [job.id]
        # Nothing else to wait for: the ready job is not "due later".
        assert spool.next_due_at() is None or spool.next_due_at() > time.time() + 30
