"""DESIGN.md as a demanding new user reads it: each test is one sentence of the contract that an
exploratory pass found broken, kept so it stays fixed."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from jobspool import RunReport, Spool, Worker


def test_asyncio_run_of_run_forever_serves_until_stop_and_returns_the_report(tmp_path: Path) -> None:
    # DESIGN §5 writes `await worker.run_forever()`; from sync code that is
    # `asyncio.run(worker.run_forever())`, which must not fail once stop() ends the run.
    spool = Spool(tmp_path / "spool", durable=False)
    spool.enqueue("note", job_id="a")
    worker = Worker(spool, handlers={"note": lambda job, ctx: "done"})
    out: dict[str, Any] = {}

    def serve() -> None:
        try:
            out["report"] = asyncio.run(worker.run_forever(handle_signals=False))
        except BaseException as exc:  # surfaced by the assertion below, not by the thread
            out["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    assert spool.wait("a", timeout=30).result == "done"
    worker.stop()
    thread.join(30)
    assert "error" not in out, out.get("error")
    report = out["report"]
    assert isinstance(report, RunReport)
    assert report.completed == 1
    assert repr(report).startswith("RunReport(")
