"""The one shape every queue under test is driven through.

A bench job is identified by an integer ``i`` carried in its payload, so that
consumers can report what they completed and the harness can check for
duplicates and missing jobs without trusting any queue's own bookkeeping.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    def loads(data: bytes | str) -> Any:
        return orjson.loads(data)

except ImportError:  # pragma: no cover - orjson is a jobspool dependency
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(data: bytes | str) -> Any:
        return json.loads(data)


def payload(i: int, pad: int) -> dict[str, Any]:
    """The payload of bench job ``i``: its id plus ``pad`` bytes of filler."""
    return {"i": i, "pad": "x" * pad}


class Claimed:
    """A claimed bench job: its bench id and whatever the queue needs to complete it."""

    __slots__ = ("handle", "i")

    def __init__(self, i: int, handle: Any) -> None:
        self.i = i
        self.handle = handle


class Adapter(ABC):
    """A queue under test, opened on ``root`` in the current process.

    ``enqueue`` and ``claim``/``complete`` take batches; adapters of queues with
    no batch API loop one job at a time, which is what their users would do.
    """

    batched: bool = True

    def warm(self) -> None:  # noqa: B027 - optional hook, a no-op for most queues
        """Whatever a long-running consumer does once at start-up (timed apart)."""

    def __init__(self, root: str, *, pad: int = 512, **options: Any) -> None:
        self.root = root
        self.pad = pad

    @abstractmethod
    def enqueue(self, ids: Sequence[int]) -> None:
        """Enqueue the bench jobs ``ids`` (durably if the queue is durable)."""

    @abstractmethod
    def claim(self, n: int) -> list[Claimed]:
        """Claim up to ``n`` ready jobs; an empty list when none is ready."""

    @abstractmethod
    def complete(self, claimed: Sequence[Claimed]) -> list[int]:
        """Complete ``claimed``; return the bench ids whose completion succeeded."""

    def prefill(self, ids: Sequence[int]) -> None:
        """Put ``ids`` in the queue as fast as possible (setup, never timed)."""
        for k in range(0, len(ids), 1000):
            self.enqueue(ids[k : k + 1000])

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the queue's resources."""
