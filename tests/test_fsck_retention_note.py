"""`fsck`'s retention note says what a prune would remove, by the rule prune applies.

It compared every terminal directory with `keep_terminal`: 4 dead letters with
`keep_terminal=2` were "over keep_terminal=2 (prune removes the oldest)", though dead
letters are kept by `keep_dead` (10,000 by default) and a prune removed none.
"""

from __future__ import annotations

from pathlib import Path

from jobspool import Spool


def _finish(spool: Spool, n: int, *, dead: bool) -> None:
    spool.enqueue_many("k", [{}] * n, max_attempts=1)
    for lease in spool.claim(limit=n):
        if dead:
            spool.fail(lease, "boom", retryable=False)
        else:
            spool.complete(lease)


def test_the_note_follows_keep_dead_and_keep_terminal(tmp_path: Path) -> None:
    with Spool(tmp_path / "s", keep_terminal=2) as spool:
        _finish(spool, 4, dead=True)
        assert not [n for n in spool.fsck().notes if "dead_letter/" in n]
        _finish(spool, 4, dead=False)
        notes = [n for n in spool.fsck().notes if "completed/" in n]
        assert notes == ["completed/ holds 4 jobs: 2 of them beyond keep_terminal=2, which "
                         "a prune removes (the oldest first)"]
        report = spool.prune()
        assert (report.counts["completed"], report.counts["dead_letter"]) == (2, 0)
        assert not [n for n in spool.fsck().notes if "holds" in n]
