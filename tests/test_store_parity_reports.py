"""What the stores answer, alike (a parity probe's findings, 2026-12-04).

Before: on the file store `complete(lease, (1, 2))` returned the caller's tuple where `get`
and the PostgreSQL store gave the stored `[1, 2]`; its `PruneReport` listed ids newest
first and counted only the states it had to scan (PostgreSQL: ids in order, every terminal
state counted); a read-only PostgreSQL spool answered `requeue_all()` with `[]` when no
dead letter was there, where the file store refused, and its refusal gave no hint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobspool import Spool
from jobspool.errors import SpoolError


@pytest.mark.parametrize("result, stored", [
    ((1, 2), [1, 2]),
    ({"a": (1, [2, (3,)])}, {"a": [1, [2, [3]]]}),
    ([{"b": ("x",)}], [{"b": ["x"]}]),
])
def test_a_completion_returns_its_result_as_stored(make_any_spool: Callable[..., Spool],
                                                   result: Any, stored: Any) -> None:
    spool = make_any_spool()
    spool.enqueue("k", {})
    (lease,) = spool.claim()
    done = spool.complete(lease, result)
    assert done.result == stored and done.result == spool.get(done.id).result


def test_a_completion_returns_a_copy_not_the_callers_dict(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    spool.enqueue("k", {})
    (lease,) = spool.claim()
    mine = {"n": [1]}
    done = spool.complete(lease, mine)
    mine["n"].append(2)
    assert done.result == {"n": [1]} == spool.get(done.id).result


def test_a_prune_report_lists_ids_in_order_and_counts_every_terminal_state(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    ids = [spool.enqueue("k", {"i": i}).id for i in range(5)]
    for lease in sorted(spool.claim(limit=5), key=lambda x: x.job_id, reverse=True):
        spool.complete(lease)  # the newest id finishes first: removal order is not id order
    report = spool.prune(keep=2)
    gone = {j for j in ids if j not in {x.id for x in spool.jobs()}}
    assert len(gone) == 3
    assert report.completed == tuple(sorted(gone))
    assert report.kept == {"completed": 2, "dead_letter": 0, "canceled": 0}
    assert report.to_dict()["pruned"] == 3


def test_a_prune_with_nothing_to_remove_still_counts_what_it_kept(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    spool.enqueue("k", {})
    (lease,) = spool.claim()
    spool.complete(lease)
    report = spool.prune(keep=10)
    assert report.pruned == ()
    assert report.kept == {"completed": 1, "dead_letter": 0, "canceled": 0}


def test_a_read_only_spool_refuses_bulk_writes_even_when_nothing_matches(
        make_any_spool: Callable[..., Spool]) -> None:
    make_any_spool()  # created, empty
    ro = make_any_spool(read_only=True)
    for write in (ro.requeue_all, lambda: ro.requeue_matching(kind="k"),
                  lambda: ro.cancel_matching(kind="k")):
        with pytest.raises(SpoolError, match=r"read-only \(open it with read_only=False"):
            write()
