"""What a claim did besides leasing, told to the worker run that made it.

A claim that takes over an expired lease whose job is out of attempts (or rescues)
dead-letters it instead of leasing it (both stores; PostgreSQL's sweep of the claim's kinds
too). Those never reach the claimer as leases, so a run's report and metrics said nothing of
them: `run-until-idle` printed "dead-lettered 0" over a job its own claim had just
dead-lettered. Noted per thread, since a claim runs in a worker thread of its own and
`Spool.claim` returns leases only.
"""

from __future__ import annotations

import threading

_NOTES = threading.local()


def dead_lettered(n: int) -> None:
    """The calling thread's claim dead-lettered `n` jobs (written: the change landed)."""
    if n:
        _NOTES.dead = getattr(_NOTES, "dead", 0) + n


def take_dead_lettered() -> int:
    """Dead letters the calling thread's claims noted since the last take, and forget them."""
    n: int = getattr(_NOTES, "dead", 0)
    _NOTES.dead = 0
    return n
