"""`WorkerSide`: what a Worker asks of a file spool beside the public API — liveness marks,
rescue counting, the live tokens projection maintenance keeps, handlers given up on.

Mixed into the file `Spool` (whose `leasing`, `journal` and `lock` these use); PostgreSQL's
`PgSpool` has its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobspool.queue import liveness
    from jobspool.queue.job import Job
    from jobspool.queue.journal import Journal
    from jobspool.queue.leasing import Leasing
    from jobspool.queue.lock import SpoolLock


class WorkerSide:
    """The worker-facing half of the file `Spool` (a mixin; the attributes are the spool's)."""

    leasing: Leasing
    journal: Journal
    lock: SpoolLock

    def abandon_blocks(self, thread_ident: int) -> None:
        """A handler's thread was given up on: end its fenced block (`Holding.abandon`)."""
        self.leasing.abandon(thread_ident)

    def forget_abandoned(self) -> None:
        """In a handler's thread, as its handler returns: a cut asked of it is void."""
        self.journal.lock.threads.forget_cuts()

    def live_tokens(self) -> list[int]:
        """Tokens of every unexpired lease."""
        self.lock.check_open()
        return self.leasing.live_tokens()

    def min_live_token(self) -> int:
        """The smallest token a live lease holds, or the next token when none is live."""
        self.lock.check_open()
        return self.leasing.min_live_token()

    def process_mark(self) -> liveness.ProcessMark:
        """This process's liveness mark in this spool (`liveness.py`)."""
        return self.leasing.process_mark()

    def reclaim_dead(self) -> int:
        """Take back the leases of provably dead holders now (see `Leasing.reclaim_dead`)."""
        self.lock.check_open()
        return self.leasing.reclaim_dead()

    def died_running(self, job: Job) -> bool:
        """Whether a leased job's holder died with its handler started and not settled."""
        return self.leasing.died_running(job)

    def note_running(self, tokens: Iterable[int], *, started: bool) -> None:
        """Record that handlers for these leases started (or settled), for rescue counting."""
        self.leasing.note_running(tokens, started=started)
