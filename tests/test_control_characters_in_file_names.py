"""A file name holding a newline or an escape sequence is shown escaped, one line per
problem: found by a probe, `fsck`, the warnings of `list`, the log of `recover` and
`quarantine list` printed such names raw (a newline split a message in two; the escape
sequence acted on the terminal)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.cli_harness import run_jobspool
from tests.spools import make_spool

_NAMES = ["ev\nil.json", "a\x1b[31mred.json"]


def _one_line_each(text: str) -> list[str]:
    assert "\x1b" not in text
    return [line for line in text.splitlines() if line.strip()]


def test_names_with_control_characters_are_shown_escaped(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="r0")
    for name in _NAMES:
        shutil.copy(root / "ready" / "r0.json", root / "ready" / name)

    fsck = run_jobspool("fsck", root=root)
    lines = _one_line_each(fsck.stdout)
    assert any("ready/ev\\nil.json" in line for line in lines), fsck.stdout
    assert any("ready/a\\x1b[31mred.json" in line for line in lines), fsck.stdout
    assert len(lines) == 2 + len(_NAMES)  # the heading, one per file, the hint

    health = run_jobspool("health", root=root)
    said = [line for line in _one_line_each(health.stdout) if "unreadable" in line]
    assert len(said) == 1 and "ready/ev\\nil.json" in said[0], health.stdout

    listed = run_jobspool("list", root=root)
    warned = _one_line_each(listed.stderr)
    assert len(warned) == len(_NAMES), listed.stderr

    recovered = run_jobspool("recover", root=root)
    assert recovered.returncode == 0, recovered.stderr
    said = [line for line in _one_line_each(recovered.stderr) if "quarantined" in line]
    assert len(said) == len(_NAMES), recovered.stderr

    shown = run_jobspool("quarantine", "list", root=root)
    assert len(_one_line_each(shown.stdout)) == len(_NAMES), shown.stdout
    first = shown.stdout.split()[0]
    one = run_jobspool("quarantine", "show", first.split(".")[0], root=root)
    head = _one_line_each(one.stdout.split("content")[0])
    assert [line.split(":")[0] for line in head[:2]] == ["name", "from"], one.stdout


def test_line_and_paragraph_separators_and_invisible_marks_are_escaped_too() -> None:
    """U+2028/U+2029 end a line for `str.splitlines` (log readers, tests): a name holding
    one made `fsck`'s line two (probe). U+200B and U+FEFF would not show at all."""
    from jobspool.errors import shown_name

    for char in ("\u2028", "\u2029", "\u200b", "\ufeff", "\x85"):
        shown = shown_name(f"ready/a{char}b.json")
        assert len(shown.splitlines()) == 1 and char not in shown, repr(shown)
    assert shown_name("ready/plain-name_1.json") == "ready/plain-name_1.json"
