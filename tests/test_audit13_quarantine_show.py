"""Audit of issue 13: `jobspool quarantine show` prints a damaged file's content on the
operator's terminal, so control characters in it (an escape sequence, a NUL) are shown
escaped, not sent to the terminal; `--json` keeps the content as it was decoded."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.cli_harness import run_cli
from tests.spools import make_spool


def test_quarantine_show_escapes_control_characters_of_the_content(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        (root / "ready" / "evil.json").write_bytes(b'{"a": 1\x1b]0;owned\x07\x1b[2J\x00\n\tend')
        spool.recover()
    code, text, _ = run_cli("quarantine", "show", "evil", root=root)
    assert code == 0
    assert not any(ch in text for ch in "\x1b\x07\x00"), repr(text)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x00" in text
    assert "\n\tend" in text  # newlines and tabs are layout, kept as they are
    code, raw, _ = run_cli("quarantine", "show", "evil", "--json", root=root)
    assert code == 0 and "\x1b[2J" in orjson.loads(raw)["content"]
