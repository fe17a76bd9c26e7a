"""Key columns named like SQL words (`null`, `true`, `false`) or in capitals: jobspool's own
filters wrote the key name bare, so `null = 'b'` matched nothing (`get` returned None for a
row that was there), `true IN ('b')` failed every upsert into a table made by a delete
with a raw planner error (retried for ever), and `Path` was read as `path`."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool import Spool, Worker
from jobspool.projection import LanceProjection
from jobspool.queue.states import JobState


def _handlers(key: str) -> dict:
    return {
        "w": lambda job, ctx: ctx.upsert("t", {key: job.payload["k"], "n": job.payload["n"]},
                                         version=job.payload["n"]),
        "d": lambda job, ctx: ctx.delete("t", [job.payload["k"]], version=job.payload["n"]),
    }


@pytest.mark.parametrize("key", ["null", "true", "false", "Path", "select"])
def test_a_keyword_key_reads_and_writes_its_rows(tmp_path: Path, key: str) -> None:
    spool = Spool(tmp_path / "spool")
    index = str(tmp_path / "index")
    handlers = _handlers(key)
    # A table made by a delete first: the upsert then reads the tombstones it must beat.
    spool.enqueue("d", {"k": "gone", "n": 1})
    Worker(spool, handlers, projection=index, keys={"t": key}).run_until_idle()
    spool.enqueue("w", {"k": "b", "n": 2})
    spool.enqueue("w", {"k": "gone", "n": 3})
    Worker(spool, handlers, projection=index, keys={"t": key}).run_until_idle()

    assert {j.state for j in spool.jobs()} == {JobState.COMPLETED}
    table = LanceProjection(index, "t", key=key)
    row = table.get("b")
    assert row is not None and row[key] == "b" and row["n"] == 2
    assert table.get("gone") is not None  # the upsert at version 3 beat the tombstone at 1
    assert table.get("missing") is None
    # A stale write still loses under such a key.
    spool.enqueue("w", {"k": "b", "n": 1})
    Worker(spool, handlers, projection=index, keys={"t": key}).run_until_idle()
    assert LanceProjection(index, "t", key=key).get("b")["n"] == 2
