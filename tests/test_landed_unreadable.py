"""A write that failed after its renames, with the re-read that checks what landed
failing too (out of file descriptors, as the write itself was): the settle said "0 of 10
settled" though all had, and the caller's next step on the old lease made a second copy
of the same revision (completed/ and dead_letter/; `requeue --all-dead` then ran
completed jobs again). A file in the state it moved into is its new version."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.errors import LeaseLost, WriteFailed
from tests.cli_harness import run_cli


def test_a_settle_whose_check_cannot_read_still_knows_what_landed(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    spool.enqueue_many("k", [{"i": i} for i in range(10)])
    leases = spool.claim(limit=10)
    store = spool.journal.store
    real_apply = store.apply

    def apply_then_run_out(*args: Any, **kwargs: Any) -> Any:
        real_apply(*args, **kwargs)  # every rename done, then the fds run out
        monkeypatch.setattr(store, "read", _no_fds)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(store, "apply", apply_then_run_out)
    out = spool.complete_many([(lease, {"ok": True}) for lease in leases])
    monkeypatch.undo()
    assert all(not isinstance(o, WriteFailed) for o in out), out
    for lease in leases:
        with pytest.raises(LeaseLost):
            spool.fail(lease, "boom", retryable=False)
    assert spool.stats()["completed"] == 10 and spool.stats()["dead_letter"] == 0
    code, out_text, err = run_cli("fsck", root=Path(spool.root))
    assert code == 0, (out_text, err)
    assert all(spool.get(lease.job_id).state is JobState.COMPLETED for lease in leases)


def _no_fds(*args: Any, **kwargs: Any) -> bytes:
    raise OSError(errno.EMFILE, "Too many open files")
