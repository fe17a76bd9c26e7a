"""`jobspool quarantine list|show|restore|purge`: look at what recovery moved aside, put a
repaired file back where running workers find it, or delete it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobspool import JobState
from tests.cli_harness import run_cli
from tests.spools import make_spool


def run_json(root: Path, *args: str) -> object:
    code, out, err = run_cli(*args, "--json", root=root)
    assert code == 0, err
    return orjson.loads(out)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("mail", {"to": "a"}, job_id="fine")
    return root


def _quarantine(root: Path, files: dict[str, bytes]) -> None:
    """Put bad files in state directories and let recovery move them aside."""
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    with make_spool(root) as spool:
        report = spool.recover()
    assert len(report.quarantined) == len(files)


def _good_job_bytes(tmp_path: Path, job_id: str) -> bytes:
    with make_spool(tmp_path / "elsewhere") as other:
        other.enqueue("mail", {"to": "restored"}, job_id=job_id)
    return (tmp_path / "elsewhere" / "ready" / f"{job_id}.json").read_bytes()


def test_list_says_empty_then_names_each_file_with_its_source_and_reason(
        root: Path) -> None:
    code, out, _ = run_cli("quarantine", "list", root=root)
    assert code == 0 and out.strip() == "quarantine is empty"
    _quarantine(root, {"ready/truncated.json": b'{"id": "trunc', "leased/empty.json": b""})
    doc = run_json(root, "quarantine", "list")
    assert isinstance(doc, dict) and doc["count"] == 2
    by_source = {f["source"]: f for f in doc["files"]}
    assert set(by_source) == {"ready/truncated.json", "leased/empty.json"}
    assert by_source["ready/truncated.json"]["size"] == len(b'{"id": "trunc')
    assert all(f["reason"] and f["quarantined_at"] for f in doc["files"])
    code, out, _ = run_cli("quarantine", "list", root=root)
    assert code == 0 and len(out.splitlines()) == 2 and "from ready/truncated.json" in out


def test_show_finds_a_file_by_job_id_or_prefix_and_prints_its_content(
        root: Path) -> None:
    _quarantine(root, {"ready/broken.json": b"{not json"})
    doc = run_json(root, "quarantine", "show", "broken")
    assert isinstance(doc, dict)
    assert doc["content"] == "{not json" and doc["readable"] is False
    assert doc["source"] == "ready/broken.json" and "JSON" in doc["problem"]
    past_time = doc["name"][:doc["name"].index("-") + 2]
    by_prefix = run_json(root, "quarantine", "show", past_time)
    assert isinstance(by_prefix, dict) and by_prefix["name"] == doc["name"]
    code, out, _ = run_cli("quarantine", "show", "broken", root=root)
    assert code == 0 and "{not json" in out and "now readable: no" in out
    code, _, err = run_cli("quarantine", "show", "no-such-file", root=root)
    assert code == 1 and err.count("\n") == 1 and "'no-such-file'" in err


def test_restore_is_refused_while_the_file_is_still_broken(
        root: Path) -> None:
    _quarantine(root, {"ready/broken.json": b"{not json"})
    code, _, err = run_cli("quarantine", "restore", "broken", root=root)
    assert code == 2 and err.count("\n") == 1 and "still not a readable job" in err
    assert not (root / "ready" / "broken.json").exists()
    assert run_json(root, "quarantine", "list")["count"] == 1  # type: ignore[index]


def test_a_repaired_file_is_restored_and_a_running_worker_claims_it_at_once(
        root: Path, tmp_path: Path) -> None:
    _quarantine(root, {"ready/late.json": b"{garbled"})
    name = run_json(root, "quarantine", "show", "late")["name"]  # type: ignore[index]
    with make_spool(root) as worker:
        assert [lease.job_id for lease in worker.claim()] == ["fine"]
        assert worker.claim() == []  # its claim index is current and ready/ is empty
        (root / "quarantine" / name).write_bytes(_good_job_bytes(tmp_path, "late"))  # repaired
        code, out, err = run_cli("quarantine", "restore", "late", root=root)
        assert code == 0, err
        assert out.strip() == f"restored {name} as ready/late.json"
        assert [lease.job_id for lease in worker.claim()] == ["late"]
    assert sorted(p.name for p in (root / "quarantine").iterdir()) == []  # reason file too


def test_restore_is_refused_when_the_spool_already_holds_the_job(
        root: Path, tmp_path: Path) -> None:
    _quarantine(root, {"completed/fine.json": b"{half a copy"})
    name = run_json(root, "quarantine", "show", "fine")["name"]  # type: ignore[index]
    (root / "quarantine" / name).write_bytes(_good_job_bytes(tmp_path, "fine"))
    code, _, err = run_cli("quarantine", "restore", name, root=root)
    assert code == 2 and "already exists (state ready)" in err
    with make_spool(root) as spool:
        assert spool.get("fine").state is JobState.READY
    assert (root / "quarantine" / name).exists()


def test_purge_deletes_named_files_or_everything_with_their_reasons(
        root: Path) -> None:
    _quarantine(root, {"ready/a.json": b"x", "ready/b.json": b"y", "retryable/c.json": b"z"})
    doc = run_json(root, "quarantine", "purge", "a")
    assert isinstance(doc, dict) and doc["count"] == 1
    assert {f["source"] for f in run_json(root, "quarantine", "list")["files"]} == {  # type: ignore[index]
        "ready/b.json", "retryable/c.json"}
    code, out, _ = run_cli("quarantine", "purge", "--older-than", "3600", root=root)
    assert code == 0 and out.strip() == "purged 0 quarantined file(s)"  # all are recent
    code, out, _ = run_cli("quarantine", "purge", root=root)
    assert code == 0 and out.strip() == "purged 2 quarantined file(s)"
    assert list((root / "quarantine").iterdir()) == []


def test_a_quarantined_directory_is_shown_refused_on_restore_and_purged(root: Path) -> None:
    """Recovery moves a directory named like a job file aside; every quarantine command
    must handle it (purge stopped at it with a raw OSError, leaving the later files)."""
    (root / "ready" / "subdir.json").mkdir()
    (root / "ready" / "subdir.json" / "inner").write_bytes(b"x")
    (root / "ready" / "zz.json").write_bytes(b"broken")
    with make_spool(root) as spool:
        assert len(spool.recover().quarantined) == 2
    doc = run_json(root, "quarantine", "show", "subdir")
    assert isinstance(doc, dict) and doc["readable"] is False and "directory" in doc["problem"]
    code, _, err = run_cli("quarantine", "restore", "subdir", root=root)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "a directory" in err
    code, out, _ = run_cli("quarantine", "purge", root=root)
    assert code == 0 and out.strip() == "purged 2 quarantined file(s)"
    assert list((root / "quarantine").iterdir()) == []


def test_an_ambiguous_id_says_how_many_match_not_that_none_does(root: Path) -> None:
    # It said "no quarantined file '1796': 3 files match".
    _quarantine(root, {"ready/a1.json": b"{bad", "retryable/a1.json": b"{bad"})
    listed = run_json(root, "quarantine", "list")
    assert isinstance(listed, dict) and listed["count"] == 2
    code, _, err = run_cli("quarantine", "show", "a1", root=root)
    assert code == 1 and "2 quarantined files match" in err and "no quarantined" not in err


def test_a_short_id_is_a_job_id_never_a_prefix_of_another_jobs_quarantined_file(
        root: Path) -> None:
    # Found in a policy probe: names start with the time in nanoseconds (`1796...`), and
    # prefixes were tried before job ids: `purge 17`, meant for job 17, deleted job abc's
    # quarantined file for good; with 17's own file there too, `show 17` was "ambiguous".
    _quarantine(root, {"ready/abc.json": b"{bad"})
    (name,) = [f["name"] for f in run_json(root, "quarantine", "list")["files"]]  # type: ignore[index]
    short = name[:2]
    code, _, err = run_cli("quarantine", "purge", short, root=root)
    assert code == 1 and f"'{short}'" in err and "must go past its time" in err
    assert [f["name"] for f in run_json(root, "quarantine", "list")["files"]] == [name]  # type: ignore[index]
    _quarantine(root, {f"ready/{short}.json": b"{bad too"})
    doc = run_json(root, "quarantine", "show", short)
    assert isinstance(doc, dict) and doc["source"] == f"ready/{short}.json"
    assert run_json(root, "quarantine", "purge", short)["count"] == 1  # type: ignore[index]
    assert [f["name"] for f in run_json(root, "quarantine", "list")["files"]] == [name]  # type: ignore[index]
