"""What waits to be claimed, per kind, counted without reading a job (`SpoolAPI.waiting`).

An idle `run_until_idle` reports what it left behind: due jobs of kinds it has no handler
for, and its own kinds' jobs not due yet. It listed every ready and retryable job to find
out, payloads and all: a drain of one kind beside a backlog of 20,000 jobs of another read
20,000 rows (or files) on its way out. The stores count instead: the file spool from its
claim index (the sort keys it already holds), PostgreSQL in one aggregate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """Jobs of one kind in `ready/` or `retryable/`: how many may be claimed now (`due`),
    how many later, and when the first of those comes due (None: none waits)."""

    due: int = 0
    later: int = 0
    next_at: float | None = None


def tally(entries: Iterable[tuple[str, bool, float]]) -> dict[str, Waiting]:
    """`Waiting` per kind from (kind, due, run_at) per job."""
    due: dict[str, int] = {}
    later: dict[str, int] = {}
    first: dict[str, float] = {}
    for kind, is_due, run_at in entries:
        if is_due:
            due[kind] = due.get(kind, 0) + 1
        else:
            later[kind] = later.get(kind, 0) + 1
            first[kind] = min(first.get(kind, run_at), run_at)
    return {kind: Waiting(due.get(kind, 0), later.get(kind, 0), first.get(kind))
            for kind in due.keys() | later.keys()}
