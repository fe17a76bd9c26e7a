"""`check_health` reads a bounded number of job files for damage, the live states first.

Reading every file took `health` 5 s warm and 24 s from a cold cache at 200,000 ready
jobs (and the dashboard's overview as long); `fsck` is the check that reads them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobspool import Spool
from jobspool.health import check_health
from tests.spools import make_spool


@pytest.fixture
def spool(spool_root: Path) -> Iterator[Spool]:
    s = make_spool(spool_root)
    yield s
    s.close()


def _fill_completed(spool: Spool, n: int) -> None:
    spool.enqueue_many("k", [{"i": i} for i in range(n)])
    spool.complete_many([(lease, None) for lease in spool.claim(kinds="k", limit=n)])


def test_a_deep_spool_is_read_only_up_to_the_budget_and_the_figures_say_so(
        spool: Spool) -> None:
    _fill_completed(spool, 30)
    spool.enqueue_many("k", [{"i": i} for i in range(20)])
    health = check_health(spool, max_files_read=12)
    assert health.ok
    assert health.figures["job_files_read"] == 12
    assert health.figures["job_files"] == 50


def test_a_small_spool_is_read_whole(spool: Spool) -> None:
    _fill_completed(spool, 5)
    spool.enqueue("k", {}, job_id="waiting")
    figures = check_health(spool).figures
    assert figures["job_files_read"] == figures["job_files"] == 6


def test_damage_where_it_stops_a_job_is_found_before_terminal_files_spend_the_budget(
        spool: Spool, spool_root: Path) -> None:
    """Terminal files only report; a damaged ready or leased file is a job that never
    runs. With a budget smaller than the completed jobs, the live directories are read
    first, so their damage is still found."""
    _fill_completed(spool, 40)
    (spool_root / "ready" / "broken.json").write_bytes(b"{not json")
    (spool_root / "leased" / "torn.json").write_bytes(b"")
    with pytest.warns(Warning):
        health = check_health(spool, max_files_read=5)
    assert health.codes() == ["unreadable_files"]
    assert "leased/torn.json" in health.reasons[0].message
    assert "ready/broken.json" in health.reasons[0].message
    assert health.figures["unreadable_files"] == 2
    assert health.figures["job_files_read"] == 5


def test_fsck_still_reads_every_file_past_the_health_budget(
        spool: Spool, spool_root: Path) -> None:
    _fill_completed(spool, 20)
    (spool_root / "completed" / "zz-damaged.json").write_bytes(b"[]")
    with pytest.warns(Warning):  # stats skips the file, saying so
        assert check_health(spool, max_files_read=0).figures["job_files_read"] == 0
    report = spool.fsck()
    assert not report.ok
    assert any("zz-damaged" in str(p) for p in report.problems)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_a_bad_budget_is_refused_in_one_line(spool: Spool, bad: object) -> None:
    with pytest.raises(ValueError, match="max_files_read"):
        check_health(spool, max_files_read=bad)  # type: ignore[arg-type]
