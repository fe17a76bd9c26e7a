"""A hand-edited counter at the 64-bit edge (found by a regression probe): the file read as
a job, but the claim's count up could not be written, and every claim of its batch failed
("worker loop failed … Integer exceeds 64-bit range" five times, its batch mates never
ran; fsck said consistent). Now it is an unreadable file like any other damaged one."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobspool import JobState, Worker
from tests.spools import make_spool


@pytest.mark.parametrize("field", ["attempts", "revision"])
def test_a_counter_at_the_64_bit_edge_is_unreadable_not_a_stuck_batch(
        tmp_path: Path, field: str) -> None:
    root = tmp_path / "s"
    ran: list[str] = []
    with make_spool(root) as spool:
        spool.enqueue("k", job_id="b1")
        spool.enqueue("k", job_id="b2")
        path = root / "ready" / "b1.json"
        path.write_bytes(orjson.dumps({**orjson.loads(path.read_bytes()),
                                       field: 2**64 - 1}))
        report = Worker(spool, {"k": lambda job, ctx: ran.append(job.id)},
                        maintenance=False).run_until_idle()
        assert ran == ["b2"] and report.completed == 1
        assert spool.get("b2").state is JobState.COMPLETED
        assert not spool.fsck().ok
