"""`jobspool worker --processes N` on either store (tests/store_params.py): the children get the
root (a directory or a URL), drain the queue exactly once between them, and SIGTERM stops the
pool cleanly."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from jobspool import JobState, Spool
from tests.cli_harness import start_jobspool
from tests.helpers_spool import stat_counts
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def test_a_worker_pool_drains_the_queue_once_and_stops_on_sigterm(
        make_any_spool: Callable[..., Spool], store_root: str | Path, tmp_path: Path) -> None:
    log = tmp_path / "handled.log"
    spool = make_any_spool(keep_terminal=10_000)
    ids = [j.id for j in spool.enqueue_many("work", [{"log": str(log)}] * 300)]
    pool = start_jobspool("worker", "--processes", "2", "--app", "tests.apps.simple:app",
                          "--kinds", "work", "--concurrency", "2", root=store_root)
    try:
        wait_until(lambda: stat_counts(spool.stats())["completed"] == len(ids), timeout=180,
                   what="the pool to drain the queue")
        assert pool.poll() is None, "the pool exited before it was told to"
        pool.send_signal(signal.SIGTERM)
        _, err = pool.communicate(timeout=120)
    finally:
        if pool.poll() is None:
            pool.kill()
            pool.communicate()
    assert pool.returncode == 0, err.decode(errors="replace")[-3000:]
    assert b"Traceback" not in err
    runs = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert runs == Counter(dict.fromkeys(ids, 1))
    assert {spool.get(i).state for i in ids} == {JobState.COMPLETED}
