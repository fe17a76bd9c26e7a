"""Another process's `enqueue(..., on_conflict="replace")` of a ready job must reach every
process's claim cache: a warm cache kept the old kind and priority, so a worker serving
only `img` claimed a job replaced into `email` (its missing handler crashed `jobspool
worker`), and a job replaced to priority -10 was claimed after priority-0 ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from jobspool import JobState, Spool, Worker
from tests.cli_harness import environment


def in_other_process(root: Path, code: str) -> None:
    subprocess.run([sys.executable, "-c", f"from jobspool import Spool\n"
                    f"with Spool({str(root)!r}) as s:\n    {code}"],
                   check=True, env=environment(), timeout=120)


def test_a_kind_replaced_by_another_process_is_not_claimed_for_the_old_kind(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root) as spool:
        in_other_process(root, "s.enqueue('img', 1, job_id='J0'); s.enqueue('img', 1, job_id='J1')")
        assert spool.claim(kinds=["zz"]) == []  # this process has listed ready/ once
        in_other_process(root, "s.enqueue('email', 1, job_id='J0', on_conflict='replace')")
        leases = spool.claim(kinds=["img"], limit=5)
        assert [(lease.job_id, lease.job.kind) for lease in leases] == [("J1", "img")]
        (email,) = spool.claim(kinds=["email"], limit=5)
        assert (email.job_id, email.job.kind) == ("J0", "email")


def test_a_priority_replaced_by_another_process_is_claimed_in_its_new_order(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root) as spool:
        in_other_process(root, "s.enqueue_many('k', [1] * 5, job_ids=[f'J{i}' for i in range(5)])")
        assert spool.claim(kinds=["zz"]) == []
        in_other_process(root, "s.enqueue('k', 2, job_id='J4', priority=-10, on_conflict='replace')")
        (first,) = spool.claim(limit=1)
        assert (first.job_id, first.job.priority, first.job.payload) == ("J4", -10, 2)


class WideClaims(Spool):
    """A store whose claim ignores the kinds asked for: what a stale cache did."""

    def claim(self, **options: Any) -> Any:
        options["kinds"] = None
        return super().claim(**options)


def test_a_worker_handed_a_job_it_has_no_handler_for_gives_it_back_uncounted(
        tmp_path: Path) -> None:
    root = tmp_path / "s"
    with WideClaims(root, durable=False) as spool:
        spool.enqueue("email", job_id="mail")
        spool.enqueue("img", job_id="pic")
        report = Worker(spool, handlers={"img": lambda job, ctx: "ok"}).run_until_idle(
            max_jobs=1)
        assert report.crashes == 0
        assert spool.get("pic").state is JobState.COMPLETED
        mail = spool.get("mail")
        assert mail.state is JobState.READY and mail.attempts == 0, mail
