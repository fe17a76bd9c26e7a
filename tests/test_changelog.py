"""The ready/ change ring: other processes' changes applied without relisting ready/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.queue.changelog import ADD, REMOVE, RING_BYTES, RING_OFFSET, SLOTS, ChangeRing
from tests.spools import make_spool


@pytest.fixture
def ring() -> ChangeRing:
    data = bytearray(RING_OFFSET + RING_BYTES)  # the lock file's shared data, in memory

    def read(offset: int, size: int) -> bytes:
        return bytes(data[offset:offset + size]).ljust(size, b"\0")

    def write(offset: int, blob: bytes) -> None:
        data[offset:offset + len(blob)] = blob

    return ChangeRing(read, write)


def test_a_batch_that_wraps_past_the_rings_end_is_read_whole(ring: ChangeRing) -> None:
    for g in range(1, SLOTS - 1):  # the ring filled to two slots before its end
        ring.record(g, [f"j{g}"], [])
    ring.record(SLOTS - 1, ["w1", "w2", "w3", "w4"], ["j1"])  # wraps: 2 slots, then 3
    assert ring.since(SLOTS - 2, SLOTS - 1) == [(ADD, "w1"), (ADD, "w2"), (ADD, "w3"),
                                                (ADD, "w4"), (REMOVE, "j1")]


def test_counters_that_went_backwards_mean_relist(ring: ChangeRing) -> None:
    ring.record(1, ["a"], [])
    assert ring.since(5, 1) is None  # `.lock` emptied: the counters started over


def test_a_reader_gets_the_changes_of_every_generation_it_missed_in_order(
        ring: ChangeRing) -> None:
    ring.record(1, ["a", "b"], [])
    ring.record(2, [], ["a"])
    ring.record(3, [], [])
    ring.record(4, ["c"], ["b"])
    assert ring.since(0, 4) == [(ADD, "a"), (ADD, "b"), (REMOVE, "a"), (ADD, "c"),
                                (REMOVE, "b")]
    assert ring.since(2, 4) == [(ADD, "c"), (REMOVE, "b")]
    assert ring.since(4, 4) == []


def test_a_generation_without_entries_means_relist(ring: ChangeRing) -> None:
    ring.record(1, ["a"], [])
    ring.record(3, ["c"], [])  # generation 2 was bumped by a writer that logged nothing
    assert ring.since(0, 3) is None
    assert ring.since(2, 3) == [(ADD, "c")]


def test_overwritten_or_oversized_batches_mean_relist(ring: ChangeRing) -> None:
    ring.record(1, ["x"], [])
    for g in range(2, SLOTS + 3):
        ring.record(g, [f"j{g}"], [])
    assert ring.since(0, SLOTS + 2) is None  # generation 1 was overwritten
    ring.record(SLOTS + 3, [f"k{i}" for i in range(SLOTS + 1)], [])  # too large to log
    assert ring.since(SLOTS + 2, SLOTS + 3) is None


def _count_listings(spool: Spool, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = spool.store.names

    def names(directory: str) -> Any:
        calls.append(directory)
        return real(directory)

    monkeypatch.setattr(spool.store, "names", names)
    return calls


def test_another_spools_enqueues_and_claims_reach_a_warm_index_without_a_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    consumer = make_spool(root)
    producer = make_spool(root)  # its own lock handle, map and index: a peer
    producer.enqueue_many("k", [{"i": i} for i in range(10)], job_ids=[f"a{i}" for i in range(10)])
    consumer.preload()
    listings = _count_listings(consumer, monkeypatch)

    taken = [lease.job_id for lease in producer.claim(limit=3)]  # the peer claims a0..a2
    producer.enqueue("k", job_id="urgent", priority=-5)
    got = [lease.job_id for lease in consumer.claim(limit=4)]

    assert taken == ["a0", "a1", "a2"]
    assert got == ["urgent", "a3", "a4", "a5"]
    assert "ready" not in listings, "the ring should have spared the listing of ready/"
    consumer.close()
    producer.close()


def test_a_change_the_ring_did_not_see_falls_back_to_a_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    consumer = make_spool(root)
    other = make_spool(root)
    other.enqueue("k", job_id="first")
    consumer.preload()
    listings = _count_listings(consumer, monkeypatch)
    (root / "ready" / "first.json").unlink()  # an out-of-band change, like a quarantine:
    with other.lock.hold():
        other.journal.touch([JobState.READY])  # its generation moves, the ring logs nothing
    assert consumer.claim() == []
    assert "ready" in listings
    consumer.close()
    other.close()
