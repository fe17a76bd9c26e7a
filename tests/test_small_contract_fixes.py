"""Small contract slips a new user met, each pinned: the backpressure message at the
limit, the CLI's hint for a kept leased job, `with` on a closed spool."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool import Spool
from jobspool.errors import Backpressure, SpoolClosed
from tests.cli_harness import run_cli
from tests.spools import make_spool


def test_backpressure_at_the_limit_says_what_admitting_would_do(tmp_path: Path) -> None:
    with make_spool(tmp_path / "s", max_due=4) as spool:
        for _ in range(4):
            spool.enqueue("k", {})
        with pytest.raises(Backpressure) as refused:
            spool.enqueue("k", {})
    # It said "4 ready jobs, over the limit max_due=4": 4 is not over 4.
    assert "4 ready jobs and 1 more, would be over the limit max_due=4" in str(refused.value)


def test_the_note_for_a_kept_leased_job_does_not_suggest_replace(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="j")
        spool.claim()
        done = run_cli("enqueue", "k", "{}", "--id", "j", root=root)
    assert done.code == 0 and "cancel it first" in done.err and "replace" in done.err
    assert "--on-conflict replace rewrites it" not in done.err


def test_entering_a_closed_spool_says_it_is_closed(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s")
    spool.close()
    with pytest.raises(SpoolClosed):
        with spool:
            pass


def test_a_root_too_long_for_its_job_files_is_refused_when_created(tmp_path: Path) -> None:
    # At ~4000 bytes `init` made the spool, then every enqueue failed (ENAMETOOLONG,
    # reported as "an unreadable file takes the id; run recover", which did nothing).
    deep = tmp_path.joinpath(*["d" * 200] * 19)
    done = run_cli("init", root=deep)
    assert done.code == 2 and "too long" in done.err and done.err.count("\n") == 1, done.err
    assert not deep.exists()
    fits = tmp_path.joinpath(*["d" * 200] * 17)  # ~3,500 bytes: the longest id still fits
    with make_spool(fits) as spool:
        job = spool.enqueue("k", {}, job_id="x" * 128)
        assert spool.get(job.id).id == "x" * 128


def test_a_result_too_large_names_the_result(tmp_path: Path) -> None:
    from jobspool.errors import JobTooLarge

    with make_spool(tmp_path / "s", max_job_bytes=4096) as spool:
        spool.enqueue("k", {})
        (lease,) = spool.claim()
        with pytest.raises(JobTooLarge) as told:
            spool.complete(lease, "r" * 10_000)
    assert told.value.field == "result"  # it said "payload"


def test_the_spools_own_index_named_explicitly_is_private_too(tmp_path: Path) -> None:
    # Left to the default it was made 0700 whatever the umask; named with --projection
    # (the same path), LanceDB made it with the umask's modes (0777 under umask 000).
    import os
    import stat

    from jobspool import Worker

    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("p", {})
        old = os.umask(0)
        try:
            Worker(spool, {"p": lambda job, ctx: ctx.upsert("t", {"id": "a"})},
                   projection=str(root / "index"), maintenance=False).run_until_idle()
        finally:
            os.umask(old)
    assert stat.S_IMODE((root / "index").stat().st_mode) & 0o077 == 0
