"""`jobspool enqueue --max-due N` / `--max-lag SECONDS`: writer backpressure from scripts.

The limits were reachable from Python only (`Spool(max_due=..., max_lag_seconds=...)`); a
shell producer had no way to stop feeding a queue whose workers had fallen behind. Refused,
the command exits 2 (the spool refusing, as for a taken id) with one line, and writes
nothing; admitted, it behaves as without the flags. Both stores.
"""

from __future__ import annotations

import time

from jobspool import Spool
from tests.cli_harness import run_jobspool


def test_max_due_refuses_with_one_line_and_writes_nothing(store_root: str, any_spool: Spool
                                                          ) -> None:
    for n in range(2):
        ok = run_jobspool("enqueue", "k", f'{{"n": {n}}}', "--max-due", "2", root=store_root)
        assert ok.code == 0, ok.err
    refused = run_jobspool("enqueue", "k", '{"n": 2}', "--id", "third", "--max-due", "2",
                           root=store_root)
    assert refused.code == 2
    line = refused.err.strip()
    assert "\n" not in line and "backpressure" in line and "max_due=2" in line, refused.err
    assert "Traceback" not in refused.err
    assert sum(1 for _ in any_spool.jobs()) == 2
    # Without the limit the same command enters.
    assert run_jobspool("enqueue", "k", '{"n": 2}', "--id", "third", root=store_root).code == 0


def test_max_lag_refuses_while_the_oldest_due_job_waits(store_root: str, any_spool: Spool
                                                        ) -> None:
    any_spool.enqueue("k", None, job_id="old")
    time.sleep(1.0)  # it has waited a second (counted from its arrival, not its run_at)
    refused = run_jobspool("enqueue", "k", "--id", "new", "--max-lag", "0.5", root=store_root)
    assert refused.code == 2 and "max_lag_seconds=0.5" in refused.err, refused.err
    assert [j.id for j in any_spool.jobs()] == ["old"]


def test_limits_that_are_not_positive_are_usage_errors(store_root: str) -> None:
    for flag, value in (("--max-due", "0"), ("--max-due", "x"), ("--max-lag", "-1")):
        bad = run_jobspool("enqueue", "k", flag, value, root=store_root)
        assert bad.code == 1 and flag in bad.err and "Traceback" not in bad.err, bad.err
