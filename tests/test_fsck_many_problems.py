"""`fsck` with many problems lists the first ones, counts the rest and says what repairs
them; `--json` lists every one.

Found by an operator probe: a bulk `cancel` SIGKILLed three times left 600 stray temp
files, and `fsck` printed 600 lines with no count and no word of `recover`."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobspool import Spool
from jobspool.cli import main
from jobspool.cli.commands import FSCK_LINES


def test_fsck_counts_past_the_first_problems_and_names_recover(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    Spool(root).close()
    strays = FSCK_LINES + 13
    for i in range(strays):
        (root / "tmp" / f"dead-writer-{i:03d}.tmp").write_bytes(b"{}")
    assert main(["--root", str(root), "fsck"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"spool has {strays} problem(s):"
    listed = [line for line in out if "stray temp file" in line]
    assert len(listed) == FSCK_LINES
    assert f"  ... and {strays - FSCK_LINES} more (--json lists every one)" in out
    assert out[-1] == "(`jobspool recover` repairs what a crash left)"

    assert main(["--root", str(root), "--json", "fsck"]) == 2
    doc = orjson.loads(capsys.readouterr().out)
    assert len([p for p in doc["problems"] if "stray temp file" in p]) == strays

    assert main(["--root", str(root), "recover"]) == 0
    capsys.readouterr()
    assert main(["--root", str(root), "fsck"]) == 0
    assert capsys.readouterr().out.strip() == "spool is consistent"


def test_fsck_lists_a_few_problems_whole(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "s"
    Spool(root).close()
    (root / "tmp" / "dead-writer.tmp").write_bytes(b"{}")
    assert main(["--root", str(root), "fsck"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "spool has 1 problem(s):"
    assert out[1] == "  tmp/dead-writer.tmp: stray temp file (no live writer will publish it)"
    assert not any("more" in line for line in out)
