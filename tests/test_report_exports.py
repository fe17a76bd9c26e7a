"""The reports `recover` and `prune` return are public names (DESIGN §5 names them as
return types), importable from `jobspool` and `jobspool.recovery`, with a count per step
(DESIGN §6) as the README shows."""

from __future__ import annotations

import time

from tests.spools import SpoolFactory


def test_reports_are_public_and_count_each_step(make_spool: SpoolFactory) -> None:
    import jobspool
    import jobspool.recovery
    from jobspool import PruneReport, RecoveryReport

    assert jobspool.recovery.RecoveryReport is RecoveryReport
    assert jobspool.recovery.PruneReport is PruneReport
    assert {"RecoveryReport", "PruneReport"} <= set(jobspool.__all__)

    spool = make_spool(keep_terminal=0)
    spool.enqueue_many("k", [1, 2, 3])
    leases = spool.claim(limit=3, lease_seconds=0.01)
    spool.complete(leases[0])
    time.sleep(0.05)
    report = spool.recover()
    assert isinstance(report, RecoveryReport)
    assert report.counts["leases_reclaimed"] == 2
    assert set(report.leases_reclaimed) == {leases[1].job_id, leases[2].job_id}
    pruned = spool.prune(keep=0)
    assert isinstance(pruned, PruneReport)
    assert pruned.counts["completed"] + report.counts["pruned"] == 1
