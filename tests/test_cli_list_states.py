"""`jobspool list --state A --state B` lists both states, in the order given, each job
once (`retryable` and `scheduled` overlap); it listed B alone, silently, with exit 0,
where `cancel` and `requeue` take `--state` repeatedly."""

from __future__ import annotations

from pathlib import Path

from tests.cli_harness import run_jobspool
from tests.spools import make_spool


def test_list_takes_several_states(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        ready = spool.enqueue("k", 1, job_id="r")
        later = spool.enqueue("k", 2, job_id="later", delay=3600)
        spool.enqueue("k", 3, job_id="done")
        (lease,) = spool.claim(kinds=["k"], limit=1)
        assert lease.job_id == ready.id
        spool.complete(lease)
    done = run_jobspool("list", "--json", "--state", "completed", "--state", "retryable",
                        root=root)
    assert done.code == 0, done
    assert [d["id"] for d in done.json()] == ["r", later.id]
    both = run_jobspool("list", "--json", "--state", "retryable", "--state", "scheduled",
                        root=root)
    assert [d["id"] for d in both.json()] == ["later"]
    one = run_jobspool("list", "--json", "--state", "ready", root=root)
    assert [d["id"] for d in one.json()] == ["done"]
