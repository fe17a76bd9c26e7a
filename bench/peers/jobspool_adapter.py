"""jobspool's ``Spool``, driven through its public batch API.

``enqueue_many`` per enqueue batch, ``claim(limit=n)`` per claim and
``complete_many`` per completion batch: what a jobspool worker does with a
batch. A completion that comes back as an error in ``complete_many``'s list
(``LeaseLost`` or any other ``JobspoolError``) is not counted as done.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bench.peers.base import Adapter, Claimed, payload


def check_available() -> None:
    from jobspool import Spool  # noqa: F401


class JobspoolAdapter(Adapter):
    def __init__(
        self,
        root: str,
        *,
        durable: bool = True,
        lease_seconds: float = 600.0,
        sync_mode: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(root, **options)
        from jobspool import Spool

        self.durable = durable
        self.lease_seconds = lease_seconds
        # Only passed when asked for, so the adapter also drives a Spool without it.
        extra = {} if sync_mode is None else {"sync_mode": sync_mode}
        self.spool = Spool(root, durable=durable, lease_seconds=lease_seconds, **extra)
        self.owner = f"bench-{os.getpid()}"

    def warm(self) -> None:
        # A worker's first claim reads the sort key of every queued job once; a
        # long-running consumer pays that at start-up, so it is timed apart.
        self.spool.preload()

    def enqueue(self, ids: Sequence[int]) -> None:
        self.spool.enqueue_many("bench", [payload(i, self.pad) for i in ids])

    def claim(self, n: int) -> list[Claimed]:
        leases = self.spool.claim(limit=n, owner=self.owner)
        return [Claimed(lease.job.payload["i"], lease) for lease in leases]

    def complete(self, claimed: Sequence[Claimed]) -> list[int]:
        results = self.spool.complete_many([(c.handle, None) for c in claimed])
        ok = [c.i for c, r in zip(claimed, results, strict=True) if not isinstance(r, Exception)]
        return ok

    def prefill(self, ids: Sequence[int]) -> None:
        # Setup only: a non-durable spool on the same root writes the same files
        # without the flushes, and the timed spool then opens that backlog.
        from jobspool import Spool

        fast = Spool(self.root, durable=False, lease_seconds=self.lease_seconds)
        for k in range(0, len(ids), 1000):
            fast.enqueue_many("bench", [payload(i, self.pad) for i in ids[k : k + 1000]])
        fast.close()

    def close(self) -> None:
        self.spool.close()
