"""Audit of issue 13: `worker_stale` clears once its cause is fixed, also after a crash.

A worker killed with SIGKILL (the OOM killer, a hard reboot) leaves its
metrics file behind; when its service restarts it, the spool is served
again, but health said `worker_stale` for the dead process until someone
deleted the file by hand. A worker now removes the files of processes that
are provably gone — written on this host by a pid that no longer exists, or
before this host last booted — when it publishes its own. Files from other
hosts, or of processes that still exist, are left for health to judge.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

from jobspool import Worker
from jobspool.health import check_health
from jobspool.queue.liveness import boot_id
from tests.spools import make_spool
from tests.waiting import wait_until

GUARD_SECONDS = 60.0  # a hang guard, never a performance claim


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _left_behind(root: Path, owner: str, **doc: object) -> Path:
    path = root / "metrics" / f"{owner.replace(':', '_')}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(orjson.dumps({"format": 1, "owner": owner, "written_at": time.time() - 600,
                                   "claimed": 7, **doc}))
    return path


def test_a_new_worker_removes_what_dead_local_workers_left_and_health_clears(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    host = socket.gethostname()
    with make_spool(root) as spool:
        crashed = _left_behind(root, "crashed", pid=_dead_pid(), host=host, boot=boot_id())
        rebooted = _left_behind(root, "before-reboot", pid=os.getpid(), host=host,
                                boot="a-previous-boot")
        elsewhere = _left_behind(root, "elsewhere", pid=_dead_pid(), host="another-host",
                                 boot=boot_id())
        stuck = _left_behind(root, "stuck", pid=os.getpid(), host=host, boot=boot_id())
        legacy = _left_behind(root, "legacy", pid=_dead_pid())  # no host: cannot tell
        # An older release's snapshot: no host or boot fields, its owner is "host:pid".
        dead = _dead_pid()
        upgraded = _left_behind(root, f"{host}:{dead}:1a2b", pid=dead)  # host:pid:hex
        upgraded_short = _left_behind(root, f"{host}:{dead}", pid=dead)
        # Damaged: a pid no process has (os.kill raised OverflowError: every worker died).
        damaged = _left_behind(root, f"{host}:huge", pid=2**63)
        upgraded_alive = _left_behind(root, f"{host}:{os.getpid()}", pid=os.getpid())
        assert check_health(spool).codes() == ["worker_stale"]

        worker = Worker(spool, {"echo": lambda job, ctx: job.payload}, maintenance=False)
        thread = threading.Thread(target=worker.run_forever, kwargs={"handle_signals": False})
        thread.start()
        try:
            # readiness: its first publish
            wait_until(lambda: not (crashed.exists() or rebooted.exists() or upgraded.exists()
                                    or upgraded_short.exists() or damaged.exists()),
                       GUARD_SECONDS,
                       "the worker to sweep the dead files")
        finally:
            worker.stop()
            thread.join(GUARD_SECONDS)
        assert elsewhere.exists() and stuck.exists() and legacy.exists()
        assert upgraded_alive.exists()
        health = check_health(spool)
        assert health.codes() == ["worker_stale"]
        message = health.reasons[0].message
        assert "crashed" not in message and "before-reboot" not in message
        assert "elsewhere" in message and "stuck" in message
        for path in (elsewhere, stuck, legacy, upgraded_alive):
            path.unlink()
        assert check_health(spool).ok


def test_a_published_snapshot_names_its_host_and_boot(tmp_path: Path) -> None:
    from jobspool.metrics import publish_worker_report
    from jobspool.queue.report import RunReport

    with make_spool(tmp_path / "spool") as spool:
        publish_worker_report(spool, "me", RunReport())
        (path,) = (tmp_path / "spool" / "metrics").glob("*.json")
    doc = orjson.loads(path.read_bytes())
    assert (doc["host"], doc["boot"], doc["pid"]) == (socket.gethostname(), boot_id(),
                                                     os.getpid())
