"""A process's claim index holds what its claims need, not every job it ever met.

Found by a soak probe: a producer that never claims kept an entry for every job it wrote
(~0.3 MB per 1,000 jobs, for ever), and a worker kept a heap entry for every job of a kind
it does not claim (another service's, or a thousand distinct kinds), since entries were
only dropped by claims of their own kind.
"""

from __future__ import annotations

from pathlib import Path

from jobspool import Spool
from jobspool.queue.journal import journal_of


def _drain(spool: Spool, kinds: list[str]) -> None:
    while leases := spool.claim(kinds=kinds, limit=200):
        spool.complete_many([(lease, None) for lease in leases])


def _entries(spool: Spool) -> int:
    journal = journal_of(spool)
    assert journal is not None
    return journal.index.entries()


def test_a_producer_that_never_claims_keeps_no_index(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root, durable=False) as producer, Spool(root, durable=False) as worker:
        for _ in range(3):
            producer.enqueue_many("k", list(range(1000)))
            for i in range(200):
                producer.enqueue("k", {"i": i}, delay=0.0 if i % 2 else 0.001)
            _drain(worker, ["k"])
        assert _entries(producer) == 0
        counts = worker.stats().counts
        assert counts["ready"] == counts["retryable"] == counts["leased"] == 0


def test_jobs_of_kinds_a_worker_never_claims_do_not_pile_up_in_its_index(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    n = 0
    with Spool(root, durable=False) as producer, Spool(root, durable=False) as mine, \
            Spool(root, durable=False) as theirs:
        for _ in range(40):
            kinds = []
            for i in range(100):
                n += 1
                kind = f"other{n % 500}"  # many kinds: each a heap of its own
                kinds.append(kind)
                producer.enqueue(kind, {"i": i}, delay=0.0 if i % 2 else 0.001)
            assert mine.claim(kinds=["mine"]) == []  # follows every change to ready/
            _drain(theirs, sorted(set(kinds)))
            assert mine.claim(kinds=["mine"]) == []
        # 4,000 jobs met, none waiting: what is left is within the heaps' rebuild slack
        # (index.py, _COMPACT_SLACK = 1024 pushes past twice the live entries).
        assert _entries(mine) <= 2 * 1024 + 200
        producer.enqueue("mine", {}, job_id="m")
        [lease] = mine.claim(kinds=["mine"])
        assert lease.job_id == "m"
