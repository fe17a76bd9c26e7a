"""A drain does not report unreadable job files as work it left.

A ready file of a kind no job may have, or a damaged file of a handled kind, was reported
by `run-until-idle` as a due job left behind ("no handler in --app"; "the first due now
... run again"), which no run could ever take: `recover` quarantines such files, and
`health` reports them as `unreadable_files`.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from jobspool import Spool, Worker


def test_unreadable_files_are_not_left_behind_work(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root) as spool:
        spool.enqueue("ok", {}, job_id="good1")
    doc = orjson.loads((root / "ready" / "good1.json").read_bytes())
    (root / "ready" / "oddkind.json").write_bytes(
        orjson.dumps({**doc, "id": "oddkind", "kind": 'we"ird\nk\\ind'}))
    (root / "ready" / "badok.json").write_bytes(
        orjson.dumps({**doc, "id": "badok", "attempts": "x"}))
    with Spool(root) as spool:
        report = Worker(spool, {"ok": lambda job, ctx: None}).run_until_idle()
    assert report.completed == 1
    assert report.unhandled == {}
    assert (report.waiting, report.waiting_due) == (0, 0)
