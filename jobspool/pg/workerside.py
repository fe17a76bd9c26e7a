"""`PgWorkerSide`: what a Worker asks of the PostgreSQL store beside the public API —
rescue counting, fencing tokens for projection maintenance, handlers given up on.

Mixed into `PgSpool` (whose `db` and `unnoted_starts` these use), as `WorkerSide` is into
the file `Spool`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from jobspool.pg import leasing, tokens

if TYPE_CHECKING:
    from jobspool.pg.core import PgCore
    from jobspool.pg.db import Database


class PgWorkerSide:
    """The worker-facing half of `PgSpool` (a mixin; the attributes are the spool's)."""

    db: Database
    unnoted_starts: set[int]

    @property
    def _store(self) -> PgCore:
        return cast("PgCore", self)  # what the statements' modules take: the whole spool

    def note_running(self, tokens: Iterable[int], *, started: bool) -> None:
        """Record the start of a rescued job's handler before it runs, for rescue counting
        (`leasing.note_started`); nothing else to record."""
        if started:
            leasing.note_started(self._store, tokens)
        else:
            self.unnoted_starts.difference_update(tokens)

    def preload(self) -> None:
        """Nothing to preload: the claim index is the database's."""

    def fence_value(self) -> int:
        return tokens.fence_value(self._store)

    def keep_tokens_above(self, token: int) -> bool:
        """Hand out no token at or below `token` from now on; whether the sequence moved."""
        return tokens.keep_tokens_above(self._store, token)

    def live_tokens(self) -> list[int]:
        return tokens.live_tokens(self._store)

    def min_live_token(self) -> int:
        return min(self.live_tokens(), default=self.fence_value() + 1)

    def abandon_blocks(self, thread_ident: int) -> None:
        """A handler's thread was given up on: end its open fenced block (`cut_block`)."""
        self.db.cut_block(thread_ident)
