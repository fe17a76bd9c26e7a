"""A write the disk refuses part-way: the caller learns what landed and adopts it.

An I/O error on the flush after a claim's or a settle's renames used to leave
leases published on disk that the worker believed failed (and completed jobs it
then reported as "lease lost"). Now the spool re-reads what the batch touched:
a claim returns the leases that reached the disk, a settle counts the jobs whose
new version landed, and only the rest get a one-line `WriteFailed`.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.errors import WriteFailed
from jobspool.queue import store as store_mod
from tests.helpers_spool import tmp_leftovers
from tests.spools import make_spool


@pytest.fixture
def durable(tmp_path: Path) -> Iterator[Spool]:
    s = make_spool(tmp_path / "spool", durable=True, sync_mode="fsync")
    yield s
    s.close()


def _failing_once(real: Callable[..., Any], err: int) -> Callable[..., Any]:
    state = {"armed": True}

    def fake(*args: Any, **kwargs: Any) -> Any:
        if state["armed"]:
            state["armed"] = False
            raise OSError(err, "injected " + errno.errorcode[err])
        return real(*args, **kwargs)

    return fake


def test_a_claim_whose_directory_flush_fails_returns_the_leases_that_landed(
        durable: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3):
        durable.enqueue("note", job_id=f"j{i}")
    durable.enqueue("note", job_id="a-first", priority=-1)
    durable.complete(durable.claim()[0])  # the first claim also reserves a block of tokens
    monkeypatch.setattr(store_mod, "fsync_dir", _failing_once(store_mod.fsync_dir, errno.EIO))
    leases = durable.claim(limit=3)
    assert sorted(lease.job_id for lease in leases) == ["j0", "j1", "j2"]
    for lease in leases:
        assert durable.get(lease.job_id).lease.token == lease.token  # type: ignore[union-attr]
    assert [durable.complete(lease).state for lease in leases] == [JobState.COMPLETED] * 3


def test_a_settle_whose_flush_fails_after_the_renames_counts_the_jobs_as_completed(
        durable: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(2):
        durable.enqueue("note", job_id=f"j{i}")
    leases = durable.claim(limit=2)
    monkeypatch.setattr(store_mod, "fsync_dir", _failing_once(store_mod.fsync_dir, errno.EIO))
    results = durable.complete_many([(lease, {"ok": True}) for lease in leases])
    assert [getattr(r, "state", r) for r in results] == [JobState.COMPLETED] * 2
    assert {j.state for j in durable.jobs()} == {JobState.COMPLETED}


def test_a_settle_whose_rename_fails_reports_a_one_line_error_and_keeps_the_lease(
        durable: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    durable.enqueue("note", job_id="j0")
    (lease,) = durable.claim()
    monkeypatch.setattr(store_mod, "os_replace", _failing_once(store_mod.os_replace, errno.ENOSPC))
    (result,) = durable.complete_many([(lease, 1)])
    assert isinstance(result, WriteFailed)
    assert result.errno == errno.ENOSPC and "\n" not in str(result)
    assert "disk is full" in str(result) and str(durable.root) in str(result)
    assert durable.get("j0").state is JobState.LEASED  # nothing changed: the lease still holds
    assert tmp_leftovers(durable.root) == []  # the unpublished staging file was removed
    assert durable.complete(lease, 2).result == 2


def test_enqueue_on_a_full_disk_names_the_spool_and_what_to_do(
        durable: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "os_write", _failing_once(store_mod.os_write, errno.ENOSPC))
    with pytest.raises(WriteFailed) as info:
        durable.enqueue("note", job_id="j0")
    assert "free space" in str(info.value) and "\n" not in str(info.value)
    assert list(durable.jobs()) == [] and tmp_leftovers(durable.root) == []
    assert durable.enqueue("note", job_id="j0").state is JobState.READY


def test_on_a_disk_with_no_room_for_new_files_a_worker_still_settles_what_it_holds(
        durable: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk refuses new inodes and blocks; settling reuses recycled files (the claim
    just retired one per job), so only producers are refused, with a one-line error."""
    durable.enqueue_many("note", list(range(10)), job_ids=[f"j{i}" for i in range(10)])
    leases = durable.claim(limit=10)

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod, "os_open", full)
    with pytest.raises(WriteFailed, match="disk is full"):
        durable.enqueue("note", job_id="late")
    done = durable.complete_many([(lease, {"ok": i}) for i, lease in enumerate(leases)])
    assert [getattr(j, "state", j) for j in done] == [JobState.COMPLETED] * 10
    assert tmp_leftovers(durable.root) == []


@pytest.mark.parametrize("how", ["enqueue", "enqueue_many"])
def test_an_enqueue_whose_shared_flush_fails_names_the_jobs_it_published(
        durable: Spool, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    # Found in the robustness pass: the jobs were renamed into ready/ (a worker could even
    # complete them) and the error said nothing landed, so a caller retried and a
    # generated id retried is a second job.
    group = durable.journal._group  # noqa: SLF001 - the flush producers share (groupflush.py)
    monkeypatch.setattr(group, "_flush_dir", _failing_once(group._flush_dir, errno.EIO))  # noqa: SLF001
    with pytest.raises(WriteFailed) as info:
        if how == "enqueue":
            durable.enqueue("note", {"n": 1})
        else:
            durable.enqueue_many("note", [{"n": 1}, {"n": 2}])
    on_disk = {j.id for j in durable.jobs(JobState.READY)}
    assert len(on_disk) == (1 if how == "enqueue" else 2)
    assert info.value.landed == on_disk
    assert all(job_id in str(info.value) for job_id in on_disk)
    assert "\n" not in str(info.value)


def test_a_rename_into_a_deleted_state_directory_names_that_directory(tmp_path: Path) -> None:
    """`rm -rf completed` under a worker: the rename's error names its source (the staging
    file, which is there), and the message sent the operator to tmp/ (a hand-damage probe)."""
    import errno as errno_mod

    from jobspool.queue.diskerrors import write_failed

    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "x.tmp").write_bytes(b"{}")
    exc = OSError(errno_mod.ENOENT, "No such file or directory", str(tmp_path / "tmp" / "x.tmp"),
                  None, str(tmp_path / "completed" / "a.json"))
    said = str(write_failed(exc, tmp_path))
    assert f"{tmp_path / 'completed'}/ is missing" in said and "jobspool init" in said, said
    assert "x.tmp" not in said


def test_a_broken_spool_json_says_how_to_go_on_and_that_way_works(tmp_path: Path) -> None:
    """A truncated spool.json was refused as "not valid JSON" by every command, init too,
    with no word on what to do (a hand-damage probe)."""
    from tests.cli_harness import run_cli

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="kept")
    (root / "spool.json").write_bytes(b"")
    code, _out, err = run_cli("--root", str(root), "stats")
    assert code == 2 and "move it away and run `jobspool init`" in err, err
    (root / "spool.json").rename(tmp_path / "spool.json.bak")
    assert run_cli("--root", str(root), "init").code == 0
    with make_spool(root) as spool:
        assert spool.get("kept").payload == {}
