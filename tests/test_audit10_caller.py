"""Issue 10, audited: a caller's slip with the API gets a one-line error naming it.

Found in the audit: using a `Spool` after `close()` (or after its `with` block)
raised `ValueError: file descriptor cannot be a negative integer (-1)` from
deep inside the lock, which names neither the spool nor the slip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool.errors import SpoolError
from tests.spools import make_spool


def test_using_a_closed_spool_says_it_was_closed(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="a")
    for call in (lambda: spool.enqueue("work", {}, job_id="b"), spool.claim, spool.stats):
        with pytest.raises(SpoolError) as info:
            call()
        assert "closed" in str(info.value) and str(root) in str(info.value)
    spool.close()  # closing twice is harmless
    with make_spool(root) as again:  # and nothing was written by the refused calls
        assert [j.id for j in again.jobs()] == ["a"]
