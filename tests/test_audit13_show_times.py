"""Audit of issue 13: `jobspool show` prints ISO times — every time it shows, the lease's
expiry included (it printed the lease as raw JSON with an epoch float)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobspool.queue.payload import iso_time
from tests.cli_harness import run_cli
from tests.spools import make_spool


def _show(root: Path, job_id: str) -> str:
    shown = run_cli("show", job_id, root=root)
    assert shown.code == 0, shown.err
    return shown.out


def test_show_prints_the_lease_expiry_of_a_leased_job_as_an_iso_time(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("mail", {}, job_id="held")
        (lease,) = spool.claim(owner="host-a:42")
    text = _show(root, "held")
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("lease:")]
    assert iso_time(lease.expires_at) in line
    assert f"token {lease.token}" in line and "host-a:42" in line
    # no bare epoch float left anywhere outside the parenthesised originals
    assert not re.search(r"(?<!\()\b1\d{9}\.\d+", line.split("(")[0]), line


def test_show_prints_none_for_a_job_without_a_lease(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("mail", {}, job_id="waiting")
    (line,) = [ln for ln in _show(root, "waiting").splitlines()
               if ln.strip().startswith("lease:")]
    assert line.split(":", 1)[1].strip() in ("null", "none")


@pytest.mark.parametrize(("message", "shown"), [
    ("bad input \x1b[2J\x07 here", "bad input \\x1b[2J\\x07 here"),
    # A policy probe: U+202E (right-to-left override) reached the terminal through `show`
    # and displayed what followed it reversed; `list` escaped it already.
    ("ok \u202etxt.exe\u2066 done", "ok \\u202etxt.exe\\u2066 done"),
])
def test_show_escapes_control_characters_in_the_error_and_traceback(
        tmp_path: Path, message: str, shown: str) -> None:
    from jobspool import Worker

    def noisy(job: object, ctx: object) -> None:
        raise ValueError(message)

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("mail", {}, job_id="noisy", max_attempts=1)
        Worker(spool, {"mail": noisy}, maintenance=False).run_until_idle()
        assert spool.get("noisy").traceback
    text = _show(root, "noisy")
    assert not set(text) & set(message) - set(shown), repr(text)
    lines = text.splitlines()
    assert f"   last_error: ValueError: {shown}" in lines
    assert f"      ValueError: {shown}" in lines  # the traceback's end
