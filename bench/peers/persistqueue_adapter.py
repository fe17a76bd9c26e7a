"""persist-queue's ``SQLiteAckQueue``: one SQLite commit per put, get and ack.

Its ``get`` selects a row and marks it unacked in two statements guarded only
by a thread lock, so two processes may both get the same row: the harness
checks for duplicates rather than assuming there are none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.peers.base import Adapter, Claimed, payload


def check_available() -> None:
    import persistqueue  # noqa: F401


class PersistQueueAdapter(Adapter):
    batched = False

    def __init__(self, root: str, **options: Any) -> None:
        super().__init__(root, **options)
        from persistqueue import SQLiteAckQueue
        from persistqueue.exceptions import Empty

        self._empty = Empty
        self.q = SQLiteAckQueue(root, multithreading=True, auto_commit=True)

    def enqueue(self, ids: Sequence[int]) -> None:
        for i in ids:
            self.q.put(payload(i, self.pad))

    def claim(self, n: int) -> list[Claimed]:
        out: list[Claimed] = []
        for _ in range(n):
            try:
                item = self.q.get(block=False, raw=True)
            except self._empty:
                break
            out.append(Claimed(item["data"]["i"], item["pqid"]))
        return out

    def complete(self, claimed: Sequence[Claimed]) -> list[int]:
        return [c.i for c in claimed if self.q.ack(id=c.handle) is not None]

    def close(self) -> None:
        self.q.close()
