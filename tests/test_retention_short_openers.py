"""Automatic retention holds for openers that each finish fewer jobs than its interval.

Found by a store-parity probe: four threads, each with its own `Spool` on one PostgreSQL
database, completed 200 jobs with `keep_terminal=3` and left 199 completed rows (each
opener counts its own terminal writes and pruned only at its first); the file spool, whose
count is shared by every process, kept 17. An opener now prunes at `close` what it
finished since its last prune.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tests.spools import make_spool


def test_openers_finishing_a_few_jobs_each_leave_about_keep_terminal(
        store_root: str | Path) -> None:
    with make_spool(store_root, keep_terminal=3) as spool:
        spool.enqueue_many("k", list(range(200)), job_ids=[f"j{i:03d}" for i in range(200)])

    def drain() -> None:
        with make_spool(store_root) as own:
            while leases := own.claim(kinds="k", limit=7):
                for lease in leases:
                    own.complete(lease, None)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with make_spool(store_root) as spool:
        counts = spool.stats().counts
        newest = sorted(j.id for j in spool.jobs(state="completed"))
    assert counts["ready"] == 0 and counts["leased"] == 0
    # Retention is amortized (a prune per 64 terminal writes on either store) and the
    # last openers may close concurrently: the bound is loose, far below 199.
    assert counts["completed"] <= 3 + 64, counts
    assert newest  # what is kept is the newest, not nothing
