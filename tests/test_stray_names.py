"""Hidden files and editor backups in a state directory (an editor's swap file, macOS's
`.DS_Store`, rsync's dot-temporaries, `x.json~`) are not jobs: `fsck` passes, `health` is
ok, `stats` counts nothing for them, and `recover` leaves them where they are (it moved an
open editor's swap file away). A file that is neither a job nor hidden is still reported.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.cli_harness import run_cli, run_jobspool
from tests.spools import make_spool

HIDDEN = [("ready", ".DS_Store"), ("ready", ".j1.json.swp"), ("completed", "j0.json~"),
          ("retryable", ".j2.json.AbC123"), ("quarantine", ".DS_Store"),
          ("ready", ".j1.json"), ("leased", ".j3.json")]  # named like jobs, but hidden


def _spool_with_strays(root: Path) -> None:
    with make_spool(root) as spool:
        spool.enqueue("mail", {}, job_id="j0")
        spool.complete(spool.claim(kinds="mail")[0], {"ok": True})
        spool.enqueue("mail", {}, job_id="j1")
    for directory, name in HIDDEN:
        (root / directory).mkdir(exist_ok=True)
        (root / directory / name).write_bytes(b"\x00 not a job \xff")


def test_hidden_files_and_backups_are_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    _spool_with_strays(root)
    fsck = run_cli("fsck", root=root)
    assert fsck.code == 0, fsck.err
    health = run_cli("health", "--json", root=root)
    assert health.code == 0, health.out
    doc = orjson.loads(health.out)
    assert doc["status"] == "ok", doc
    stats = orjson.loads(run_cli("stats", "--json", root=root).out)
    assert stats["counts"]["ready"] == 1 and stats["counts"]["completed"] == 1, stats
    listing = run_jobspool("list", root=root)  # a process: its log lines reach stderr
    # Every read warned "skipping unreadable job file ready/.j1.json ... recover moves it
    # to quarantine/", which recover (rightly) never did.
    assert "skipping" not in listing.err, listing.err
    assert sorted(line.split()[0] for line in listing.out.splitlines()) == ["j0", "j1"]
    assert stats["quarantined"] == 0, stats
    assert run_cli("recover", root=root).code == 0
    for directory, name in HIDDEN:
        assert (root / directory / name).exists(), name  # not moved into quarantine
    assert orjson.loads(run_cli("quarantine", "list", "--json", root=root).out)["count"] == 0


def test_a_file_that_is_neither_a_job_nor_hidden_is_still_reported(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    _spool_with_strays(root)
    (root / "ready" / "notes.txt").write_text("a note")
    assert run_cli("fsck", root=root).code == 2
