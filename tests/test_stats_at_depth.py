"""`stats` on a file spool deeper than it reads one by one.

Found by a scale probe: past 20,000 retryable files `stats` skipped them and said due 0,
scheduled 0 (and `health` ok) with 50,000 delayed jobs due; past the cap an even sample is
read and its counts scaled, and the figures say they were estimated. And the oldest wait
was read from the 16 oldest ids alone, which requeued dead letters (old ids, a fresh wait)
filled: `health` missed a queue not draining."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobspool.queue import stats as stats_module
from tests.cli_harness import run_cli
from tests.spools import make_spool


def test_due_and_scheduled_are_estimated_from_a_sample_past_the_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("later", [{}] * 20, delay=3600)  # scheduled, not due
        soon = spool.enqueue_many("soon", [{}] * 20, delay=0.05)  # scheduled, due by now
        while time.time() <= max(j.run_at for j in soon):
            time.sleep(0.05)
        exact = spool.stats()
        monkeypatch.setattr(stats_module, "_MAX_RETRYABLE_SCAN", 10)
        estimated = spool.stats()
    assert (exact.due, exact.scheduled, exact.retryable_sampled) == (20, 40, None)
    # Every 4th of 40 (in creation order): 5 of each kind, scaled by 4.
    assert (estimated.due, estimated.scheduled, estimated.retryable_sampled) == (20, 40, 10)
    assert estimated.oldest_due_age is not None
    assert estimated.to_dict()["retryable_sampled"] == 10


def test_the_cli_says_when_its_figures_are_estimated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("later", [{}] * 30, delay=3600)
    exact = run_cli("stats", root=root)
    assert exact.code == 0, exact.err
    assert "30 scheduled" in exact.out and "estimated" not in exact.out
    monkeypatch.setattr(stats_module, "_MAX_RETRYABLE_SCAN", 10)
    shown = run_cli("stats", root=root)
    assert shown.code == 0, shown.err
    assert "30 scheduled" in shown.out
    assert "estimated from 10 of 30 read" in shown.out


@pytest.mark.parametrize("depth", ["read", "spread"])
def test_requeued_old_jobs_do_not_hide_the_oldest_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depth: str) -> None:
    if depth == "spread":  # past the count read file by file: a sample of the ready jobs
        monkeypatch.setattr(stats_module, "_EXACT_COUNT", 10)
        monkeypatch.setattr(stats_module, "_READY_SPREAD", 8)
    with make_spool(tmp_path / "s") as spool:
        dead = spool.enqueue_many("dead", [{}] * 16)
        for lease in spool.claim(kinds="dead", limit=16):
            spool.fail(lease, "boom", retryable=False)
        spool.enqueue_many("waiting", [{}] * 100)
        time.sleep(1.0)  # the 100 have waited at least this long
        assert len(spool.requeue_all()) == len(dead)  # old ids, waiting from now
        stats = spool.stats()
    assert stats.due == 116
    assert stats.oldest_due_age is not None and stats.oldest_due_age >= 1.0
