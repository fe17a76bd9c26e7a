"""dirq ``QueueSimple``: one file per element, locked by a hard link, no fsync at all.

A claim lists the queue (``first()`` rebuilds the element list) and locks up to
``n`` elements; completion removes them. Nothing is flushed, so a crash can lose
or tear acknowledged elements: it is the bar for ``durable=False``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.peers.base import Adapter, Claimed, dumps, loads, payload


def check_available() -> None:
    import dirq  # noqa: F401


class DirqAdapter(Adapter):
    def __init__(self, root: str, **options: Any) -> None:
        super().__init__(root, **options)
        from dirq.QueueSimple import QueueSimple

        self.q = QueueSimple(root)

    def enqueue(self, ids: Sequence[int]) -> None:
        for i in ids:
            self.q.add(dumps(payload(i, self.pad)))

    def claim(self, n: int) -> list[Claimed]:
        out: list[Claimed] = []
        name = self.q.first()
        while name and len(out) < n:
            # lock() is False when another consumer holds it or removed it meanwhile.
            if self.q.lock(name):
                out.append(Claimed(loads(self.q.get(name))["i"], name))
            name = self.q.next()
        return out

    def complete(self, claimed: Sequence[Claimed]) -> list[int]:
        for c in claimed:
            self.q.remove(c.handle)
        return [c.i for c in claimed]
