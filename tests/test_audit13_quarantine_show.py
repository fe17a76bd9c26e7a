"""Audit of issue 13: `jobspool quarantine show` prints a damaged file's content on the
operator's terminal, so control characters in it (an escape sequence, a NUL) are shown
escaped, not sent to the terminal; `--json` keeps the content as it was decoded."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import orjson

from jobspool import Spool
from jobspool.cli import main


def _run(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue()


def test_quarantine_show_escapes_control_characters_of_the_content(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with Spool(root, durable=False) as spool:
        (root / "ready" / "evil.json").write_bytes(b'{"a": 1\x1b]0;owned\x07\x1b[2J\x00\n\tend')
        spool.recover()
    code, text = _run("--root", str(root), "quarantine", "show", "evil")
    assert code == 0
    assert not any(ch in text for ch in "\x1b\x07\x00"), repr(text)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x00" in text
    assert "\n\tend" in text  # newlines and tabs are layout, kept as they are
    code, raw = _run("--root", str(root), "quarantine", "show", "evil", "--json")
    assert code == 0 and "\x1b[2J" in orjson.loads(raw)["content"]
