"""An operator on a bad day: odd files in the spool, misbehaving replay hooks, hand-edited
quarantined files. Each case was found by trying it (a new-user pass) and failed before
its fix: a traceback, a hang, a silent exit, a wrong answer."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat as stat_mod
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState, Spool
from jobspool.errors import SpoolError
from tests.cli_harness import run_jobspool
from tests.spools import make_spool


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "spool"
    with make_spool(r) as spool:
        spool.enqueue("k", job_id="a")
    return r


def _one_document(out: str) -> Any:
    return orjson.loads(out)  # raises unless stdout is exactly one JSON document


def test_a_file_name_that_is_not_utf8_is_quarantined_and_every_json_output_holds(
        root: Path) -> None:
    # It stopped `recover` on every run (its reason file could not be encoded), and broke
    # `fsck --json`, `health --json` and `quarantine list --json` with a traceback.
    (root / "ready" / os.fsdecode(b"\xff\xfe.json")).write_bytes(b"junk")
    for command in (("fsck",), ("health",)):
        r = run_jobspool(*command, "--json", root=root)
        assert r.code == 2 and "Traceback" not in r.err, r.err
        assert r"\\xff\\xfe" in r.out and _one_document(r.out)["ok"] is False
    r = run_jobspool("recover", "--json", root=root)
    assert r.code == 0 and _one_document(r.out)["quarantined"], r.err
    r = run_jobspool("quarantine", "list", "--json", root=root)
    assert r.code == 0 and _one_document(r.out)["count"] == 1, r.err
    assert run_jobspool("fsck", root=root).code == 0


def test_a_fifo_or_a_symlink_where_a_job_file_belongs_neither_hangs_nor_is_followed(
        root: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the spool")
    os.mkfifo(root / "ready" / "fifo.json")  # opening it for reading blocked every reader
    os.symlink(secret, root / "ready" / "link.json")
    for command in (("stats",), ("list",), ("fsck",), ("show", "fifo")):
        r = run_jobspool(*command, root=root, timeout=60)
        assert "Traceback" not in r.err, (command, r.err)
    r = run_jobspool("recover", "--json", root=root, timeout=60)
    assert r.code == 0 and sorted(_one_document(r.out)["quarantined"]) == [
        "ready/fifo.json", "ready/link.json"], r.out
    (name,) = [n for n in os.listdir(root / "quarantine")
               if n.endswith("link.json")]
    r = run_jobspool("quarantine", "show", name, "--json", root=root)
    doc = _one_document(r.out)
    assert "not for the spool" not in r.out and doc["content"] == "" and doc["readable"] is False
    assert secret.read_text() == "not for the spool"


def _prepared(root: Path, n: int = 2) -> list[str]:
    """Prepared jobs past the grace period (the clock moved an hour on)."""
    with make_spool(root) as spool:
        for i in range(n):
            spool.prepare("k", job_id=f"p{i}")
    return [f"p{i}" for i in range(n)]


def _recover_later(root: Path, replay: Any) -> Any:
    later = time.time() + 3600
    with Spool(root, durable=False, clock=lambda: later) as spool:
        return spool.recover(replay=replay)


def test_an_async_replay_hook_is_awaited(root: Path) -> None:
    # Its coroutine was taken for an answer ("unknown"): committed jobs were dead-lettered.
    ids = _prepared(root)

    async def hook(job: Any) -> str:
        return "committed"

    report = _recover_later(root, {"k": hook})
    assert sorted(report.replayed_committed) == ids
    with make_spool(root) as spool:
        assert {spool.get(i).state for i in ids} == {JobState.READY}


class _Unshowable(Exception):
    def __repr__(self) -> str:
        raise RuntimeError("repr boom")


class _Incomparable:
    def __eq__(self, other: object) -> bool:
        raise ValueError("eq boom")

    __hash__ = None  # type: ignore[assignment]


@pytest.mark.parametrize("behaviour", ["exit", "unshowable", "incomparable"])
def test_a_hook_that_fails_oddly_counts_as_unknown_and_recovery_goes_on(
        root: Path, behaviour: str) -> None:
    # SystemExit ended `recover` silently; an exception whose repr raised, or an answer
    # whose == raised (a numpy array), aborted the run before the other jobs and pruning.
    _prepared(root)

    def hook(job: Any) -> Any:
        if job.id == "p1":
            return "committed"
        if behaviour == "exit":
            raise SystemExit(3)
        if behaviour == "unshowable":
            raise _Unshowable
        return _Incomparable()

    report = _recover_later(root, hook)
    assert list(report.replay_unknown) == ["p0"] and list(report.replayed_committed) == ["p1"]


def test_replay_hooks_printing_leave_json_stdout_one_document(tmp_path: Path) -> None:
    root = tmp_path / "quick"  # prepared jobs are replayed at once
    with make_spool(root, prepare_grace_seconds=0.01) as spool:
        spool.prepare("k", job_id="p0")
    time.sleep(0.05)
    r = run_jobspool("recover", "--app", "tests.apps.replays:chatty", "--json", root=root)
    assert r.code == 0, r.err
    assert _one_document(r.out)["replayed_committed"] == ["p0"]
    assert "loading tests.apps.replays" in r.err and "replaying p0" in r.err


def test_one_replay_hook_for_every_kind_on_an_app_object(root: Path) -> None:
    # It gave a traceback ("'method' object is not iterable") through --app.
    r = run_jobspool("recover", "--app", "tests.apps.replays:one_hook", "--json", root=root)
    assert r.code == 0 and "Traceback" not in r.err, r.err
    _one_document(r.out)


def test_restore_refuses_an_oversized_file_and_fences_a_restored_token(root: Path) -> None:
    with make_spool(root) as spool:
        [lease] = spool.claim()
    big = orjson.loads((root / "leased" / "a.json").read_bytes())
    (root / "leased" / "a.json").write_bytes(b"garbage")
    with make_spool(root) as spool:
        spool.recover()
    (name,) = [n for n in os.listdir(root / "quarantine") if n.endswith("a.json")]
    qfile = root / "quarantine" / name
    qfile.write_bytes(orjson.dumps({**big, "payload": "x" * 70_000}))
    r = run_jobspool("quarantine", "restore", name, root=root)
    assert r.code == 2 and "over max_job_bytes" in r.err, r.err
    # Repaired by hand with a token far above the fence, and made unreadable to others.
    big["lease"]["token"] = lease.token + 1000
    qfile.write_bytes(orjson.dumps(big))
    qfile.chmod(0)
    r = run_jobspool("quarantine", "restore", name, root=root)
    assert r.code == 0, r.err
    assert (root / "leased" / "a.json").stat().st_mode & 0o777 == 0o600
    assert run_jobspool("fsck", root=root).code == 0  # the fence was raised with it
    with make_spool(root) as spool:
        spool.enqueue("k", job_id="b")
        assert [x.token for x in spool.claim(kinds="k")] == [lease.token + 1001]


def test_a_job_whose_file_cannot_be_read_is_not_reported_missing(root: Path) -> None:
    (root / "ready" / "a.json").write_bytes(b"garbage")
    with make_spool(root) as spool:
        with pytest.raises(SpoolError, match=r"its file ready/a\.json cannot be read"):
            spool.get("a")
        with pytest.raises(SpoolError, match=r"its file ready/a\.json cannot be read"):
            spool.cancel("a")
    r = run_jobspool("show", "a", root=root)
    assert r.code == 2 and "cannot be read" in r.err


def test_stats_skips_an_unreadable_file_instead_of_counting_it(root: Path) -> None:
    """DESIGN §2: `stats` skips an unreadable file with a warning. It counted every name in
    a state directory, so a garbage file showed as one more ready (and due) job."""
    (root / "ready" / "bad.json").write_text("{bad")
    (root / "retryable" / "worse.json").write_bytes(b"\x00\x01")
    with make_spool(root) as spool:
        stats = spool.stats()
        assert stats.ready == 1 and stats.retryable == 0 and stats.total == 1
        assert stats.due == 1
        assert [j.id for j in spool.jobs()] == ["a"]
    res = run_jobspool("--root", root, "--json", "stats")
    assert res.returncode == 0
    doc = _one_document(res.stdout)
    assert doc["counts"]["ready"] == 1 and doc["total"] == 1
    assert "bad.json" in res.stderr  # the warning names the file


@pytest.mark.parametrize("removed", ["tmp/pool", "tmp"])
def test_deleting_the_recycling_pool_under_an_open_spool_leaves_no_stale_copies(
        tmp_path: Path, removed: str) -> None:
    """`rm -rf tmp/pool` under a live worker: each superseded file was left in place (the
    failed recycle taken for "already gone"), a stale copy of every job it touched; with
    `tmp/` gone too, every write failed until the spool was opened again."""
    import shutil

    root = tmp_path / "s"
    with make_spool(root, durable=True) as spool:
        ids = [j.id for j in spool.enqueue_many("k", [{"n": n} for n in range(30)])]
        for lease in spool.claim(limit=10):
            spool.complete(lease)
        shutil.rmtree(root / removed)
        for lease in spool.claim(limit=20):
            spool.complete(lease)
        assert all(spool.get(i).state is JobState.COMPLETED for i in ids)
        copies = {p.name for d in ("ready", "leased") for p in (root / d).glob("*.json")}
        assert copies == set()  # no superseded file left behind
        assert spool.fsck().ok
    # Remade at once (not at the next open), with the mode the spool's directories have.
    assert (root / "tmp" / "pool").is_dir()
    assert (root / "tmp/pool").stat().st_mode == (root / "ready").stat().st_mode
    assert (root / "tmp").stat().st_mode == (root / "ready").stat().st_mode


def test_a_reader_on_a_spool_whose_lock_file_was_deleted_says_how_to_bring_it_back(
        root: Path) -> None:
    (root / ".lock").unlink()
    r = run_jobspool("--root", root, "stats")
    assert r.code == 2 and "Traceback" not in r.err
    assert "missing" in r.err and "jobspool recover" in r.err and len(r.err.splitlines()) == 1
    assert run_jobspool("--root", root, "recover").code == 0
    assert run_jobspool("--root", root, "stats").code == 0


def test_a_spool_whose_spool_json_was_deleted_keeps_its_access_and_says_its_settings_reset(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: reopened (or `init` run again), it silently got default settings and its
    directory was chmod'ed to 0700, locking out the group that shared it."""
    root = tmp_path / "spool"
    with make_spool(root, access="group", max_attempts=9) as spool:
        spool.enqueue("k", job_id="j1")
    (root / "spool.json").unlink()
    with caplog.at_level(logging.WARNING), make_spool(root) as again:
        assert again.settings.access == "group"
        assert again.get("j1").state.value == "ready"
    assert stat_mod.S_IMODE(root.stat().st_mode) == 0o2770
    assert any("spool.json is missing" in r.getMessage() and "defaults" in r.getMessage()
               for r in caplog.records)


def test_init_says_which_deleted_directories_it_made_again(tmp_path: Path) -> None:
    """`init` on a spool whose state directories were deleted by hand makes them again
    empty; it printed "spool already initialized" alone, as if all were well."""
    root = tmp_path / "s"
    with Spool(root) as spool:
        spool.enqueue("k", 1)
    shutil.rmtree(root / "ready")
    (root / "live").rmdir()
    done = run_jobspool("init", "--json", root=root)
    assert done.code == 0, done.err
    assert json.loads(done.out)["recreated"] == ["ready", "live"]
    assert "recreated missing ready/, live/ empty: the jobs a state directory held are gone" \
        in done.err
    assert (root / "ready").is_dir() and (root / "live").is_dir()
    again = run_jobspool("init", root=root)
    assert again.code == 0 and "recreated" not in again.err
