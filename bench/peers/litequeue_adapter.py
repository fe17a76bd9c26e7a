"""litequeue: SQLite WAL, one message per put/pop/done, each its own commit.

Its default is ``synchronous=NORMAL`` (a WAL commit is not flushed before it
returns, so the last commits can be lost on power failure); ``synchronous=FULL``
is what makes it durable.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bench.peers.base import Adapter, Claimed, dumps, loads, payload


def check_available() -> None:
    import litequeue  # noqa: F401


class LiteQueueAdapter(Adapter):
    batched = False

    def __init__(self, root: str, *, synchronous: str | None = None, **options: Any) -> None:
        super().__init__(root, **options)
        from litequeue import LiteQueue

        os.makedirs(root, exist_ok=True)
        self.q = LiteQueue(os.path.join(root, "queue.db"), timeout=60.0)
        if synchronous is not None:
            self.q.conn.execute(f"PRAGMA synchronous = {synchronous}")

    def enqueue(self, ids: Sequence[int]) -> None:
        for i in ids:
            self.q.put(dumps(payload(i, self.pad)).decode())

    def claim(self, n: int) -> list[Claimed]:
        out: list[Claimed] = []
        for _ in range(n):
            msg = self.q.pop()
            if msg is None:
                break
            out.append(Claimed(loads(msg.data)["i"], msg.message_id))
        return out

    def complete(self, claimed: Sequence[Claimed]) -> list[int]:
        done = []
        for c in claimed:
            self.q.done(c.handle)
            done.append(c.i)
        return done

    def close(self) -> None:
        self.q.close()
