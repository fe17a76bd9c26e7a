"""A job file nested deeper than jobspool writes (orjson reads ~1,024 levels, writes 254):
hand-made, or restored from quarantine. It read as a valid job that no transition could
write back: every claim of it failed (`run-until-idle` gave up, its batch mates never
ran), `show` ended in a traceback, fsck called the spool consistent. Now it is an
unreadable file, as any other: skipped by claims, named by fsck and show, quarantined by
recover."""

from __future__ import annotations

from pathlib import Path

import orjson

from jobspool import JobState, Worker
from jobspool.queue.job import MAX_JSON_DEPTH
from tests.cli_harness import run_jobspool
from tests.spools import make_spool


def _bury(root: Path, job_id: str, levels: int) -> None:
    """Rewrite a ready job's file with its payload nested `levels` deep."""
    path = root / "ready" / f"{job_id}.json"
    doc = orjson.loads(path.read_bytes())
    text = orjson.dumps({**doc, "payload": "HOLE"}).decode()
    path.write_text(text.replace('"HOLE"', "[" * levels + "]" * levels))


def test_a_job_file_nested_past_what_jobspool_writes_is_unreadable_not_fatal(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    ran: list[str] = []
    with make_spool(root) as spool:
        spool.enqueue("work", job_id="deep")
        spool.enqueue("work", job_id="edge")
        spool.enqueue("work", job_id="plain")
        _bury(root, "deep", 300)
        _bury(root, "edge", MAX_JSON_DEPTH)  # as deep as enqueue takes: still a job
        report = Worker(spool, {"work": lambda job, ctx: ran.append(job.id)},
                        maintenance=False).run_until_idle()
        assert sorted(ran) == ["edge", "plain"] and report.completed == 2
    shown = run_jobspool("show", "deep", root=root)
    assert shown.code != 0 and "Traceback" not in shown.err
    assert "nested deeper" in shown.err
    fsck = run_jobspool("fsck", root=root)
    assert fsck.code != 0 and "deep" in fsck.out + fsck.err
    recovered = run_jobspool("recover", "--json", root=root)
    assert recovered.code == 0, recovered.err
    assert not (root / "ready" / "deep.json").exists()
    assert any(p.name.endswith(".ready.deep.json") for p in (root / "quarantine").iterdir())
    with make_spool(root) as spool:
        assert spool.get("plain").state is JobState.COMPLETED
