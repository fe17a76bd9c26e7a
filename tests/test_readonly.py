"""Read-only inspection: a user who may read a spool but not write it can look at it.

`stats`, `stats --prometheus`, `list`, `show`, `health`, `fsck` and
`quarantine list|show` open the spool read-only; commands that write are
refused with one line naming the cause, and nothing on disk changes.

The spool is owned by root and the commands run in a forked child that
drops to `nobody` (tests run as root here; root bypasses permission
checks, so a read-only test as root would prove nothing). Without root, the
spool is made read-only with chmod instead. Read access is granted
explicitly (new spools are private to their owner).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobspool import JobState
from jobspool.errors import SpoolError
from tests.cli_harness import run_cli
from tests.forked_cli import forked_cli
from tests.spools import make_spool

READ_COMMANDS = (
    ("stats", "--json"),
    ("stats", "--by-kind", "--json"),
    ("stats", "--prometheus"),
    ("list", "--json"),
    ("list", "--state", "dead_letter", "--json"),
    ("health", "--json"),
    ("fsck", "--json"),
    ("quarantine", "list", "--json"),
)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A spool directory outside pytest's private (0700) temp tree, so another user can
    reach it once granted."""
    base = Path(tempfile.mkdtemp(prefix="jobspool-ro-"))
    os.chmod(base, 0o755)
    try:
        yield base / "spool"
    finally:
        for dirpath, dirnames, _ in os.walk(base):  # undo a non-root chmod a-w
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
        os.chmod(base, 0o755)
        shutil.rmtree(base)


def _grant_read(root: Path, *, writable: bool) -> None:
    """Others may read (and, as a non-root fallback, nobody may write) the whole spool."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            mode = stat.S_IMODE(os.lstat(p).st_mode) | 0o444
            os.chmod(p, mode if writable else mode & ~0o222)
        mode = stat.S_IMODE(os.stat(dirpath).st_mode) | 0o555
        os.chmod(dirpath, mode if writable else mode & ~0o222)


def _populate(root: Path) -> dict[str, str]:
    with make_spool(root) as spool:
        ids = {"dead": spool.enqueue("report", {"n": 1}).id}
        (claimed,) = spool.claim(kinds=["report"])
        spool.fail(claimed, "boom", retryable=False)
        ids["done"] = spool.enqueue("email", {"to": "b@example.com"}).id
        (claimed,) = spool.claim(kinds=["email"])
        spool.complete(claimed, {"sent": True})
        ids["ready"] = spool.enqueue("email", {"to": "a@example.com"}).id
    (root / "ready" / "broken.json").write_bytes(b"{not json")
    with make_spool(root) as spool:
        spool.recover()  # one file in quarantine/ for `quarantine list`
    return ids


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*filenames, *dirnames]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_ino, st.st_mtime_ns)
    return out


def _as_reader(argv: list[str]) -> dict[str, Any]:
    """Run the CLI in a forked child that cannot write the spool; its exit code and output."""
    return forked_cli(argv, as_nobody=True)


def _as_owner(argv: list[str]) -> dict[str, Any]:
    code, out, err = run_cli(*argv)
    return {"code": code, "out": out, "err": err}


def _drop_volatile(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _drop_volatile(v) for k, v in doc.items()
                if k not in ("now", "checked_at", "oldest_due_age", "oldest_ready_age",
                             "free_bytes", "free_percent", "free_inodes",
                             "free_inodes_percent")}
    if isinstance(doc, list):
        return [_drop_volatile(v) for v in doc]
    return doc


def test_read_commands_work_for_a_user_who_may_only_read_the_spool(shared_root: Path) -> None:
    ids = _populate(shared_root)
    commands = [*READ_COMMANDS, ("show", ids["dead"], "--json"), ("show", ids["done"], "--json")]
    # As the owner first: the expected output (and every module the commands import is
    # loaded before the child drops its rights).
    expected = {c: _as_owner(["--root", str(shared_root), *c]) for c in commands}
    _grant_read(shared_root, writable=os.geteuid() == 0)
    before = _snapshot(shared_root)
    for command in commands:
        got = _as_reader(["--root", str(shared_root), *command])
        want = expected[command]
        assert got["code"] == want["code"], (command, got["err"])
        assert "Traceback" not in got["err"], got["err"]
        if "--json" in command:
            assert _drop_volatile(orjson.loads(got["out"])) == \
                _drop_volatile(orjson.loads(want["out"])), command
        else:
            assert "jobspool_jobs{" in got["out"] and "jobspool_dead_letters 1.0" in got["out"]
    assert _snapshot(shared_root) == before  # a reader changes nothing on disk
    stats = orjson.loads(_as_reader(["--root", str(shared_root), "stats", "--json"])["out"])
    assert (stats["ready"], stats["dead_letter"], stats["completed"]) == (1, 1, 1)
    health = orjson.loads(_as_reader(["--root", str(shared_root), "health", "--json"])["out"])
    assert "dead_letters" in [r["code"] for r in health["reasons"]]


def test_write_commands_are_refused_for_a_reader_with_one_line_and_nothing_changes(
        shared_root: Path) -> None:
    ids = _populate(shared_root)
    commands = (["enqueue", "email"], ["cancel", ids["ready"]], ["requeue", ids["dead"]],
                ["requeue", "--kind", "report"], ["recover"], ["prune"])
    # The owner runs them on a copy first, so every module they import is loaded before the
    # child drops its rights (the interpreter's own files may be out of a reader's reach).
    scratch = shared_root.with_name("scratch")
    shutil.copytree(shared_root, scratch, symlinks=True)
    for command in commands:
        assert _as_owner(["--root", str(scratch), *command])["code"] == 0, command
    _grant_read(shared_root, writable=os.geteuid() == 0)
    before = _snapshot(shared_root)
    for command in commands:
        got = _as_reader(["--root", str(shared_root), *command])
        assert got["code"] == 2, (command, got)
        lines = got["err"].splitlines()
        assert len(lines) == 1 and lines[0].startswith("jobspool: error: "), (command, lines)
        assert "writable" in lines[0] or "ermission" in lines[0], lines[0]
    assert _snapshot(shared_root) == before


def test_a_read_only_spool_refuses_every_write_naming_the_cause(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        job = spool.enqueue("email", {"to": "a@example.com"})
    before = _snapshot(root)
    with make_spool(root, read_only=True) as ro:
        assert ro.get(job.id).state is JobState.READY
        assert ro.stats().ready == 1
        assert [j.id for j in ro.jobs()] == [job.id]
        assert ro.fsck().ok
        for write in (lambda: ro.enqueue("email"), lambda: ro.claim(), ro.recover,
                      lambda: ro.cancel(job.id), lambda: ro.requeue_matching(kind="email"),
                      lambda: ro.cancel_matching(kind="email"), ro.prune):
            with pytest.raises(SpoolError, match="read-only"):
                write()
    assert _snapshot(root) == before


def test_opening_read_only_never_creates_a_spool_or_touches_a_foreign_directory(
        tmp_path: Path) -> None:
    with pytest.raises(SpoolError, match="does not exist"):
        make_spool(tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing").exists()
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(SpoolError, match="not a spool"):
        make_spool(foreign, read_only=True)
    assert sorted(os.listdir(foreign)) == ["cat.jpg"]
