"""Issue 10 item 9, audited: what a worker and recovery write keeps the spool's modes too.

Found in the audit: under `umask 0` the job files were 0600, but `metrics/`
(a worker's counters) came out 0777 — a world-writable directory inside a
private spool, which nothing checked —, a quarantined file's `.reason` 0644,
and `index/` (the default projection, rows built from payloads) 0777. The
files LanceDB writes inside `index/` follow the umask (they are LanceDB's),
so the directory that holds them is what keeps them private.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.spools import make_spool
from tests.subproc import REPO, cli_env

_UNDER_UMASK_0 = textwrap.dedent("""
    import os, sys
    os.umask(0)
    from jobspool import Spool, Worker
    from jobspool.metrics import publish_worker_report
    root, access = sys.argv[1], sys.argv[2]
    with Spool(root, access=access) as spool:
        spool.enqueue("note", {"text": "hello"}, job_id="n1")
        with open(os.path.join(root, "ready", "broken.json"), "w") as f:
            f.write('{"id": "brok')  # recovery quarantines it, with a reason file
        def note(job, ctx):
            ctx.upsert("notes", {"id": job.id, "text": job.payload["text"]})
        report = Worker(spool, {"note": note}, maintenance=False).run_until_idle()
        assert report.completed == 1, report
        publish_worker_report(spool, "worker-1", report)  # as a running worker does
        spool.recover()
""")


def _run(root: Path, access: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _UNDER_UMASK_0, str(root), access], cwd=REPO,
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("access", "dirs", "files"), [
    ("private", 0o700, 0o600),
    ("group", 0o2770, 0o660),
])
def test_metrics_quarantine_reasons_and_the_index_keep_the_spools_modes(
        tmp_path: Path, access: str, dirs: int, files: int) -> None:
    root = tmp_path / "spool"
    _run(root, access)
    reasons = list((root / "quarantine").glob("*.reason"))
    snapshots = list((root / "metrics").glob("*.json"))
    assert reasons and snapshots, (reasons, snapshots)
    wrong = {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode))
             for p in [root / "metrics", root / "index"] if stat.S_IMODE(p.stat().st_mode) != dirs}
    wrong |= {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode))
              for p in [*reasons, *snapshots] if stat.S_IMODE(p.stat().st_mode) != files}
    assert wrong == {}, f"expected {oct(dirs)} / {oct(files)}: {wrong}"
    with make_spool(root) as spool:  # and the spool still opens: nothing in it is world-writable
        assert spool.get("n1").state == "completed"


@pytest.mark.parametrize("edit", ["drop the access key", "rename the settings object"])
def test_a_spool_json_that_lost_its_access_keeps_the_directorys(tmp_path: Path,
                                                                 edit: str) -> None:
    """A hand edit of spool.json dropped `access` (or the whole `settings` object): the
    default made a group spool's new files private, and its group's workers could not read
    them (found by a hand-damage probe)."""
    import orjson

    root = tmp_path / "spool"
    make_spool(root, access="group").close()
    doc = orjson.loads((root / "spool.json").read_bytes())
    if edit == "drop the access key":
        del doc["settings"]["access"]
    else:
        doc["settingz"] = doc.pop("settings")
    (root / "spool.json").write_bytes(orjson.dumps(doc))
    with make_spool(root) as spool:
        job = spool.enqueue("k", {})
    assert stat.S_IMODE((root / "ready" / f"{job.id}.json").stat().st_mode) == 0o660


@pytest.mark.parametrize("access", ["private", "group"])
def test_an_empty_tmp_dir_adopted_by_a_new_spool_gets_its_mode(tmp_path: Path,
                                                               access: str) -> None:
    # Found following the README as a new user: `--create` over a directory holding an
    # empty `tmp/` made a private spool whose tmp/ stayed 0755.
    root = tmp_path / "spool"
    (root / "tmp").mkdir(parents=True, mode=0o755)
    (root / "tmp").chmod(0o755)
    with make_spool(root, access=access):
        pass
    want = stat.S_IMODE(root.stat().st_mode)
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == want, oct(want)
