"""An interrupted command says so in one line on stderr, whatever psycopg logs as the
transaction it interrupted is rolled back.

Found by an operator probe: `cancel --kind` and `migrate` on PostgreSQL, interrupted by
SIGINT or SIGTERM, printed psycopg's "error ignored in rollback of <psycopg.Transaction
...>: sending query failed: another command is already in progress" before their own line
in 4 of 9 runs. Here the interrupted command logs what psycopg logs then, as it does."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from jobspool import Spool
from jobspool.cli import commands, main


def test_an_interrupted_command_prints_one_line_not_psycopgs_rollback_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    Spool(tmp_path / "s").close()

    def interrupted(args: argparse.Namespace) -> int:
        # Where psycopg logs them: the transaction's rollback on `psycopg.transaction`
        # (a child: the parent's filters never see its records), the connection's on
        # `psycopg`.
        logging.getLogger("psycopg.transaction").warning(
            "error ignored in rollback of %s: %s", "<psycopg.Transaction [ACTIVE]>",
            "sending query failed: another command is already in progress")
        logging.getLogger("psycopg").warning(
            "error ignored in rollback on %s: %s", "<psycopg.Connection [ACTIVE]>",
            "sending query failed: another command is already in progress")
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "cmd_stats", interrupted)
    code = main(["--root", str(tmp_path / "s"), "stats"])
    err = capsys.readouterr().err
    assert code == 130
    assert err.splitlines() == [
        "jobspool: error: interrupted by SIGINT; what was done before it stands"], err
    # Nothing for a log handler to print either (the CLI's, or Python's last resort).
    assert not [r for r in caplog.records if r.name.startswith("psycopg")], caplog.records


def test_other_psycopg_warnings_are_still_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    Spool(tmp_path / "s").close()

    def warns(args: argparse.Namespace) -> int:
        logging.getLogger("psycopg").warning("some other warning")
        return 0

    monkeypatch.setattr(commands, "cmd_stats", warns)
    assert main(["--root", str(tmp_path / "s"), "stats"]) == 0
    assert [r.getMessage() for r in caplog.records if r.name == "psycopg"] == [
        "some other warning"]
