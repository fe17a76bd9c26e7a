"""Bad input is refused at the boundary with a specific error, a one-line message, and no file.

DESIGN §2: ids and kinds outside their patterns, path tricks, payloads that
are not JSON, jobs over `max_job_bytes` raise a `JobspoolError` subclass and
nothing is written; a spool root that is a file, unwritable, or has a symlink
in place of one of its directories raises `SpoolError` naming the path.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool
from jobspool.errors import InvalidJob, JobNotFound, JobspoolError, JobTooLarge, SpoolError
from tests.helpers_spool import all_files, assert_disk_consistent, tmp_leftovers
from tests.spools import make_spool
from tests.strategies import BAD_JOB_IDS, BAD_KINDS


def _one_line(err: BaseException) -> None:
    msg = str(err)
    assert msg and "\n" not in msg, f"message is not one line: {msg!r}"


def _nothing_outside(root: Path) -> None:
    """Nothing was written above or beside the spool root (path tricks stay inside)."""
    parent = root.parent
    assert sorted(p.name for p in parent.iterdir()) == [root.name]


@pytest.mark.parametrize("bad_id", BAD_JOB_IDS, ids=repr)
def test_enqueue_refuses_a_bad_job_id_and_writes_nothing(spool: Spool, spool_root: Path,
                                                          bad_id: Any) -> None:
    before = all_files(spool_root)
    with pytest.raises(InvalidJob) as info:
        spool.enqueue("note", {"x": 1}, job_id=bad_id)
    _one_line(info.value)
    assert all_files(spool_root) == before
    _nothing_outside(spool_root)


@pytest.mark.parametrize("bad_kind", BAD_KINDS, ids=repr)
def test_enqueue_refuses_a_bad_kind_and_writes_nothing(spool: Spool, spool_root: Path,
                                                        bad_kind: Any) -> None:
    before = all_files(spool_root)
    with pytest.raises(InvalidJob) as info:
        spool.enqueue(bad_kind, {"x": 1})
    _one_line(info.value)
    assert all_files(spool_root) == before


def test_the_longest_valid_id_and_kind_are_accepted(spool: Spool) -> None:
    job = spool.enqueue("k" * 128, job_id="a" + "b" * 127)
    assert spool.get("a" + "b" * 127).kind == "k" * 128
    assert job.id == "a" + "b" * 127


def test_valid_ids_with_dots_dashes_and_underscores_are_accepted(spool: Spool) -> None:
    for job_id in ("a.b", "a-b", "a_b", "0", "A.-_9", "x..y"):
        assert spool.enqueue("note", job_id=job_id).id == job_id


@pytest.mark.parametrize("bad_id", ["../x", "a/b", "", "a\x00b", "x" * 130])
@pytest.mark.parametrize("op", ["get", "cancel", "requeue"])
def test_lookups_refuse_a_path_like_id(spool: Spool, spool_root: Path, bad_id: str,
                                       op: str) -> None:
    (spool_root.parent / "x.json").write_bytes(b"{}")
    before = all_files(spool_root)
    with pytest.raises((InvalidJob, JobNotFound)) as info:
        getattr(spool, op)(bad_id)
    _one_line(info.value)
    assert all_files(spool_root) == before
    assert (spool_root.parent / "x.json").read_bytes() == b"{}"


@pytest.mark.parametrize(
    "payload",
    [object(), {1, 2}, {"k": object()}, b"bytes", {"n": 2**70}, {1j: 2}],
    ids=["object", "set", "nested-object", "bytes", "huge-int", "complex-key"],
)
def test_enqueue_refuses_a_payload_that_is_not_json(spool: Spool, spool_root: Path,
                                                    payload: Any) -> None:
    before = all_files(spool_root)
    with pytest.raises(InvalidJob) as info:
        spool.enqueue("note", payload)
    _one_line(info.value)
    assert all_files(spool_root) == before


def test_enqueue_over_max_job_bytes_raises_job_too_large_and_leaves_no_file(
    spool: Spool, spool_root: Path
) -> None:
    before = all_files(spool_root)
    with pytest.raises(JobTooLarge) as info:
        spool.enqueue("note", {"blob": "x" * 70_000}, job_id="big")
    _one_line(info.value)
    assert isinstance(info.value, InvalidJob)
    assert all_files(spool_root) == before
    assert tmp_leftovers(spool_root) == []
    with pytest.raises(JobNotFound):
        spool.get("big")


def test_max_job_bytes_is_configurable(tmp_path: Path, clock: Any) -> None:
    s = make_spool(tmp_path / "s", clock=clock, max_job_bytes=2048)
    try:
        s.enqueue("note", "x" * 500)
        before = all_files(tmp_path / "s")
        with pytest.raises(JobTooLarge):
            s.enqueue("note", "x" * 3000)
        assert all_files(tmp_path / "s") == before
    finally:
        s.close()


def test_enqueue_many_with_one_bad_item_writes_none_of_them(spool: Spool,
                                                            spool_root: Path) -> None:
    before = all_files(spool_root)
    with pytest.raises(InvalidJob):
        spool.enqueue_many("note", [{"a": 1}, {"b": object()}, {"c": 3}])
    with pytest.raises(JobTooLarge):
        spool.enqueue_many("note", [{"a": 1}, "x" * 70_000])
    with pytest.raises(InvalidJob):
        spool.enqueue_many("note", [1, 2], job_ids=["ok", "../bad"])
    assert all_files(spool_root) == before


def test_complete_with_a_result_over_max_job_bytes_dead_letters_the_job_whole(
    spool: Spool, spool_root: Path
) -> None:
    """DESIGN §9 (sizes, over §2's "refused"): a result that does not fit dead-letters that
    job; its file stays within the limit, without the result, and nothing is left in tmp/."""
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    with pytest.raises(JobTooLarge, match="dead-lettered"):
        spool.complete(lease, {"r": "x" * 70_000})
    dead = spool.get("j")
    assert dead.state is JobState.DEAD_LETTER and dead.result is None
    assert (spool_root / "dead_letter" / "j.json").stat().st_size <= 65536
    assert tmp_leftovers(spool_root) == []


def test_complete_with_a_result_that_is_not_json_is_refused(spool: Spool,
                                                            spool_root: Path) -> None:
    from tests.helpers_spool import file_bytes

    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    before = file_bytes(spool_root, "j")
    with pytest.raises(InvalidJob):
        spool.complete(lease, object())
    assert file_bytes(spool_root, "j") == before


def test_a_long_error_is_stored_clipped_to_1024_characters(spool: Spool) -> None:
    spool.enqueue("note", job_id="j")
    (lease,) = spool.claim()
    job = spool.fail(lease, "E" * 5000, retryable=False)
    assert job.last_error is not None
    assert 0 < len(job.last_error) <= 1024
    assert spool.get("j").last_error == job.last_error


@pytest.mark.parametrize(
    "kwargs",
    [{"delay": -1.0}, {"delay": float("nan")}, {"delay": float("inf")}, {"priority": 1.5},
     {"priority": "1"}, {"max_attempts": 0}, {"max_attempts": -3}, {"max_attempts": 2.0}],
    ids=repr,
)
def test_enqueue_refuses_bad_options(spool: Spool, spool_root: Path,
                                     kwargs: dict[str, Any]) -> None:
    before = all_files(spool_root)
    with pytest.raises(InvalidJob) as info:
        spool.enqueue("note", **kwargs)
    _one_line(info.value)
    assert all_files(spool_root) == before


@pytest.mark.parametrize("lease_seconds", [0, 0.0, -1.0, float("nan")])
def test_claim_refuses_a_lease_that_is_not_positive(spool: Spool, spool_root: Path,
                                                    lease_seconds: float) -> None:
    spool.enqueue("note", job_id="j")
    before = all_files(spool_root)
    with pytest.raises(JobspoolError) as info:
        spool.claim(lease_seconds=lease_seconds)
    assert "lease_seconds" in str(info.value)
    assert all_files(spool_root) == before
    assert str(spool.get("j").state) == "ready"


@pytest.mark.parametrize("lease_seconds", [0, -5.0])
def test_spool_refuses_a_default_lease_that_is_not_positive(tmp_path: Path,
                                                            lease_seconds: float) -> None:
    with pytest.raises(JobspoolError) as info:
        make_spool(tmp_path / "s", lease_seconds=lease_seconds)
    assert "lease_seconds" in str(info.value)


def test_a_root_that_is_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "afile"
    root.write_text("not a spool")
    with pytest.raises(SpoolError) as info:
        make_spool(root)
    assert str(root) in str(info.value)
    _one_line(info.value)
    assert root.read_text() == "not a spool"


def test_a_root_below_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    root = tmp_path / "afile" / "spool"
    with pytest.raises(SpoolError) as info:
        make_spool(root)
    assert "afile" in str(info.value)


def _unwritable_root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        return ro / "spool"
    # chmod does not stop root; sysfs refuses mkdir even to root.
    sys_dir = Path("/sys")
    assert sys_dir.is_dir(), "no read-only place to put an unwritable root"
    return sys_dir / "jobspool-test-unwritable" / "spool"


def test_an_unwritable_root_is_refused_naming_it(tmp_path: Path) -> None:
    root = _unwritable_root(tmp_path)
    try:
        with pytest.raises(SpoolError) as info:
            make_spool(root)
        assert "jobspool-test-unwritable" in str(info.value) or str(root) in str(info.value)
        _one_line(info.value)
    finally:
        if root.parent.name == "ro":
            root.parent.chmod(0o700)


def test_a_missing_root_with_create_false_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpoolError) as info:
        make_spool(tmp_path / "nope", create=False)
    assert "nope" in str(info.value)
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("which", ["ready", "leased", "completed", "tmp", "quarantine"])
def test_a_symlink_in_place_of_a_spool_directory_is_refused_naming_it(
    tmp_path: Path, clock: Any, which: str
) -> None:
    root = tmp_path / "s"
    make_spool(root, clock=clock).close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = root / which
    shutil.rmtree(target)  # tmp/ may hold a reusable pool
    target.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(SpoolError) as info:
        s = make_spool(root, clock=clock)
        # If opening did not check, the first write must.
        try:
            s.enqueue("note", job_id="j")
            (lease,) = s.claim()
            s.complete(lease)
        finally:
            s.close()
    assert which in str(info.value)
    assert list(elsewhere.iterdir()) == []


def test_a_root_that_is_a_symlink_to_a_directory_is_usable_or_refused_but_never_escapes(
    tmp_path: Path, clock: Any
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    try:
        s = make_spool(link, clock=clock)
    except SpoolError:
        return
    try:
        s.enqueue("note", job_id="j")
        assert (real / "ready" / "j.json").exists()
    finally:
        s.close()


def test_a_fresh_spool_has_the_documented_layout(spool: Spool, spool_root: Path) -> None:
    for d in ("prepared", "ready", "leased", "retryable", "completed", "dead_letter",
              "canceled", "tmp", "quarantine"):
        assert (spool_root / d).is_dir() and not (spool_root / d).is_symlink(), d
    assert (spool_root / "spool.json").is_file()
    assert_disk_consistent(spool_root)
