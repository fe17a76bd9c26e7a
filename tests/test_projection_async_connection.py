"""DESIGN §5: `projection=` takes "a LanceDB URI or connection". An async one
(`lancedb.connect_async`) was accepted, then every job writing the projection failed with
"'coroutine' object has no attribute ..." and was charged an attempt. Refused up front,
in one line, naming what to give instead."""

from __future__ import annotations

import asyncio
from pathlib import Path

import lancedb
import pytest

from jobspool import App, ConfigError, ProjectionError, Spool, Worker
from jobspool.projection.lance import LanceProjection


def _noop(job, ctx) -> None:  # type: ignore[no-untyped-def]
    ctx.upsert("t", {"id": "a", "x": 1})


def test_an_async_lancedb_connection_is_refused_before_any_job(tmp_path: Path) -> None:
    async def main() -> None:
        conn = await lancedb.connect_async(str(tmp_path / "ix"))
        with Spool(tmp_path / "spool") as spool:
            spool.enqueue("k", {}, job_id="j")
            for build in (lambda: Worker(spool, {"k": _noop}, projection=conn),
                          lambda: App(handlers={"k": _noop}, projection=conn)):
                with pytest.raises(ConfigError, match="async LanceDB connection") as info:
                    build()
                assert "\n" not in str(info.value)
            with pytest.raises(ProjectionError, match="async LanceDB connection"):
                LanceProjection(conn, "t")
            job = spool.get("j")
            assert job is not None and job.attempts == 0 and job.state.value == "ready"

    asyncio.run(main())


def test_a_sync_lancedb_connection_still_works(tmp_path: Path) -> None:
    conn = lancedb.connect(str(tmp_path / "ix"))
    with Spool(tmp_path / "spool") as spool:
        spool.enqueue("k", {}, job_id="j")
        assert Worker(spool, {"k": _noop}, projection=conn).run_until_idle().completed == 1
    assert LanceProjection(conn, "t").get("a") is not None
