"""A state directory that cannot be listed (an I/O error, a permission taken away) during
`recover`, `prune` or `fsck`: a one-line `SpoolError` naming the directory, not a raw
OSError from deep in a scan (a boot script catching `JobspoolError` around
`spool.recover()` crashed), and nothing changed."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.errors import SpoolError


def _refusing(real: Callable[..., Any], part: str) -> Callable[..., Any]:
    """`real` (os.scandir or os.listdir), refusing paths ending in `part` with EIO."""
    def fake(path: Any = ".", *args: Any) -> Any:
        if os.fspath(path).endswith(part):
            raise OSError(errno.EIO, "Input/output error", os.fspath(path))
        return real(path, *args)
    return fake


@pytest.mark.parametrize(("operation", "lister"), [
    ("recover", "scandir"), ("fsck", "scandir"), ("prune", "scandir"), ("prune", "listdir")])
def test_an_unlistable_state_directory_is_a_one_line_spool_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str, lister: str) -> None:
    spool = Spool(tmp_path / "s", durable=False)
    spool.enqueue("k", {"n": 1}, job_id="a")
    spool.complete(spool.claim()[0])
    spool.enqueue("k", {"n": 2}, job_id="b")
    with monkeypatch.context() as m:
        m.setattr(os, lister, _refusing(getattr(os, lister), "completed"))
        try:
            getattr(spool, operation)(**({"keep": 0} if operation == "prune" else {}))
        except SpoolError as exc:
            text = str(exc)
            assert "\n" not in text
            assert "Input/output error" in text and "completed" in text, text
            assert "dmesg" in text  # what to do about it
        else:
            pytest.fail(f"{operation} did not list completed/ with os.{lister}")
    assert spool.get("a").state is JobState.COMPLETED
    assert spool.get("b").state is JobState.READY
    spool.close()


def test_recover_names_the_directory_it_could_not_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path / "s", durable=False)
    spool.enqueue("k", job_id="a")
    with monkeypatch.context() as m:
        m.setattr(os, "scandir", _refusing(os.scandir, "leased"))
        with pytest.raises(SpoolError, match=r"cannot read spool .*Input/output error .*leased"):
            spool.recover()
    assert spool.get("a").state is JobState.READY
    spool.close()
