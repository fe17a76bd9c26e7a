"""Audit of issue 13: `jobspool show` prints ISO times — every time it shows, the lease's
expiry included (it printed the lease as raw JSON with an epoch float)."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_show_escapes_control_characters_in_the_error_and_traceback(tmp_path: Path) -> None:
    from jobspool import Worker

    def noisy(job: object, ctx: object) -> None:
        raise ValueError("bad input \x1b[2J\x07 here")

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("mail", {}, job_id="noisy", max_attempts=1)
        Worker(spool, {"mail": noisy}, maintenance=False).run_until_idle()
        assert spool.get("noisy").traceback
    text = _show(root, "noisy")
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    lines = text.splitlines()
    assert "   last_error: ValueError: bad input \\x1b[2J\\x07 here" in lines
    assert "      ValueError: bad input \\x1b[2J\\x07 here" in lines  # the traceback's end


def test_show_escapes_bidirectional_overrides_as_list_does(tmp_path: Path) -> None:
    # A policy probe: U+202E (right-to-left override) reached the terminal through `show`
    # and displayed what followed it reversed; `list` escaped it already.
    from jobspool import Worker

    def tricky(job: object, ctx: object) -> None:
        raise ValueError("ok \u202etxt.exe\u2066 done")

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("mail", {}, job_id="tricky", max_attempts=1)
        Worker(spool, {"mail": tricky}, maintenance=False).run_until_idle()
    text = _show(root, "tricky")
    assert "\u202e" not in text and "\u2066" not in text
    assert "   last_error: ValueError: ok \\u202etxt.exe\\u2066 done" in text.splitlines()
