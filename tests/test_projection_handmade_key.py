"""A projection table made without jobspool (by hand with lancedb, another tool) that has
the fencing columns but no primary key: concurrent merges of one new key each inserted
it, so a key was there several times for good (a probe: 3 processes, 75 keys three
times). Its first fenced write sets the key (making a nullable key column NOT NULL
first); a table holding a key twice or a row without a key waits, uncounted, until it is
mended by hand."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pytest

from jobspool import App, Context, Job, JobState, Spool, Worker
from jobspool.projection.lance import LanceProjection
from jobspool.projection.schema import primary_key_of
from tests.spawned import at_once

ROUNDS, WRITERS = 8, 3


def _fields(nullable_key: bool) -> list[pa.Field]:
    return [pa.field("id", pa.string(), nullable=nullable_key), pa.field("val", pa.int64()),
            pa.field("version", pa.float64()), pa.field("fence", pa.int64()),
            pa.field("_deleted", pa.bool_()), pa.field("_written_at", pa.float64())]


def _writer(index: int, uri: str, barrier: Any) -> None:
    from jobspool.projection.handler import make_upsert
    from jobspool.projection.lance import ProjectionStore

    store = ProjectionStore(uri)
    for r in range(ROUNDS):
        barrier.wait(timeout=60)
        rows = [{"id": f"r{r}-k{k}", "val": index} for k in range(4)]
        for _ in range(10):  # a lost commit race is retried, as a worker retries the job
            if store.apply([make_upsert(f"j{index}-{r}", "kv", rows, 1.0, 100 + index)]).ok:
                break


def test_concurrent_writers_of_a_hand_made_table_insert_each_key_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "proj")
    lancedb.connect(uri).create_table("kv", schema=pa.schema(_fields(nullable_key=False)))
    at_once(_writer, WRITERS, uri, timeout=120)
    rows = lancedb.connect(uri).open_table("kv").to_arrow().to_pylist()
    counts = Counter(r["id"] for r in rows)
    assert {k: n for k, n in counts.items() if n > 1} == {}
    assert len(counts) == ROUNDS * 4
    assert primary_key_of(lancedb.connect(uri).open_table("kv").schema) == "id"
    assert LanceProjection(uri, "kv").get("r0-k0") is not None


def _upsert(job: Job, ctx: Context) -> None:
    ctx.upsert("kv", {"id": "a", "val": 1}, version=1)


def test_a_hand_made_table_keyed_on_a_nullable_column_gets_its_key(tmp_path: Path) -> None:
    uri = str(tmp_path / "proj")
    lancedb.connect(uri).create_table("kv", data=[  # made from data: `id` nullable
        {"id": "b", "val": 0, "version": 1.0, "fence": 0, "_deleted": False,
         "_written_at": 0.0}])
    with Spool(tmp_path / "spool") as spool:
        spool.enqueue("w", {}, job_id="w1")
        app = App(handlers={"w": _upsert}, projection=uri)
        assert Worker(spool, app, maintenance=False).run_until_idle().completed == 1
    schema = lancedb.connect(uri).open_table("kv").schema
    assert primary_key_of(schema) == "id" and not schema.field("id").nullable
    assert LanceProjection(uri, "kv").get("a") is not None


@pytest.mark.parametrize(("ids", "says"), [(["a", "a"], "held more than once"),
                                          (["a", None], "without a key")])
def test_a_hand_made_table_that_cannot_be_keyed_waits_uncounted(
        tmp_path: Path, ids: list[str | None], says: str,
        caplog: pytest.LogCaptureFixture) -> None:
    uri = str(tmp_path / "proj")
    lancedb.connect(uri).create_table("kv", data=[
        {"id": key, "val": n, "version": float(n), "fence": 0, "_deleted": False,
         "_written_at": 0.0} for n, key in enumerate(ids)])
    with Spool(tmp_path / "spool") as spool:
        spool.enqueue("w", {}, job_id="w1", max_attempts=1)
        app = App(handlers={"w": _upsert}, projection=uri)
        report = Worker(spool, app, maintenance=False).run_until_idle(wait_for_retries=0)
        assert report.deferred == 1 and report.dead_lettered == 0
        job = spool.get("w1")
        assert job is not None and (job.state, job.attempts) == (JobState.RETRYABLE, 0)
        assert says in (job.last_error or "")
    assert lancedb.connect(uri).open_table("kv").count_rows() == 2
    # The log gives the remedy that works: it sent the operator to `jobspool maintain`,
    # which said the table was fine.
    said = [r.getMessage() for r in caplog.records if "could not be written" in r.getMessage()]
    assert said and all("maintain" not in m and "by hand" in m for m in said), said
