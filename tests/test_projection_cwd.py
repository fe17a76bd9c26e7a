"""A relative projection path names one directory for the whole run.

The projection was opened lazily with the path as given: a handler's `os.chdir()` before
the first write (a tool that changes directory, a build step) moved the whole projection,
and a table's rows were split between two directories; `maintain` saw one of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jobspool import Spool, Worker
from jobspool.projection.lance import LanceProjection


def test_a_handler_changing_directory_does_not_move_the_projection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)

    def handler(job: Any, ctx: Any) -> None:
        if job.payload["chdir"]:
            os.chdir(tmp_path / "elsewhere")
        ctx.upsert("notes", {"id": job.id, "text": "x"})

    with Spool(tmp_path / "s") as spool:
        spool.enqueue("note", {"chdir": True}, job_id="c1")
        worker = Worker(spool, handlers={"note": handler}, projection="idx", batch_size=1)
        spool.enqueue("note", {"chdir": False}, job_id="w1")
        assert worker.run_until_idle().completed == 2
    assert not (tmp_path / "elsewhere" / "idx").exists()
    rows = LanceProjection(str(tmp_path / "idx"), "notes").to_arrow().to_pylist()
    assert sorted(r["id"] for r in rows) == ["c1", "w1"]


def test_a_projection_under_the_home_directory_stays_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with Spool(tmp_path / "s") as spool:
        spool.enqueue("note", {}, job_id="n1")
        worker = Worker(spool, handlers={"note": lambda job, ctx: ctx.upsert(
            "notes", {"id": job.id})}, projection="~/idx")
        assert worker.run_until_idle().completed == 1
    assert not (tmp_path / "~").exists()
    rows = LanceProjection(str(tmp_path / "home" / "idx"), "notes").to_arrow().to_pylist()
    assert [r["id"] for r in rows] == ["n1"]
