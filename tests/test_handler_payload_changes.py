"""A handler that changes its own payload (adds an embedding beside each row, a common
pattern) changes nothing the spool keeps, on both stores (tests/store_params.py). It
changed the lease's job, which the settle encodes: on PostgreSQL the job stayed leased
(its failure could not be recorded) and ran again at every expiry; with projection
writes it was dead-lettered, "handler result refused" blaming its small result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobspool import Context, Job, JobState, Spool, Worker


class Embedding:
    """Not JSON, as a numpy array is not."""


def adds_to_its_payload(job: Job, ctx: Context) -> dict[str, int]:
    for row in job.payload["rows"]:
        row["vector"] = Embedding()
    job.payload["seen"] = True
    return {"embedded": len(job.payload["rows"])}


def test_a_handler_changing_its_payload_completes_and_the_stored_payload_stays(
        any_spool: Spool) -> None:
    payload: dict[str, Any] = {"rows": [{"id": "a"}, {"id": "b"}]}
    job = any_spool.enqueue("embed", payload, max_attempts=1)
    report = Worker(any_spool, {"embed": adds_to_its_payload},
                    maintenance=False).run_until_idle()
    assert report.completed == 1 and report.dead_lettered == 0, report
    done = any_spool.get(job.id)
    assert done.state is JobState.COMPLETED and done.result == {"embedded": 2}
    assert done.payload == payload


def test_with_projection_writes_too(any_spool: Spool, tmp_path: Path) -> None:
    def embeds_and_writes(job: Job, ctx: Context) -> dict[str, int]:
        rows = job.payload["rows"]
        for row in rows:
            row["n"] = 1
            row["extra"] = Embedding()
        ctx.upsert("docs", [{"id": r["id"], "n": r["n"]} for r in rows])
        return {"written": len(rows)}

    job = any_spool.enqueue("embed", {"rows": [{"id": "a"}, {"id": "b"}]}, max_attempts=1)
    worker = Worker(any_spool, {"embed": embeds_and_writes}, maintenance=False,
                    projection=str(tmp_path / "index"))
    report = worker.run_until_idle()
    assert report.completed == 1 and report.dead_lettered == 0, report
    assert any_spool.get(job.id).result == {"written": 2}
    assert worker.projection_store().table("docs").count() == 2
