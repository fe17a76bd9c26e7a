"""Audit of issue 13: read-only inspection that lasts.

A spool writes every file with its saved access mode, so read access granted
once with `chmod -R o+rX` does not cover the jobs written afterwards: the
reader's `list` skipped them and its `health` called them damaged ("run
`jobspool recover`", which would not touch them). `access="group-read"`
(directories 02750, files 0640) lets the spool's group read it, and only
read it, for good; a reader who may not open some files is told that, under
its own reason code.

Tests run as root and drop to `nobody` in a forked child (root would bypass the
permissions); without root, a file is made unreadable with chmod instead.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from jobspool.health import check_health
from tests.cli_harness import run_cli
from tests.spools import make_spool
from tests.test_readonly import _as_owner, _as_reader

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="jobspool-group-read-"))
    os.chmod(path, 0o755)  # outside pytest's private temp tree, so another user can reach it
    try:
        yield path
    finally:
        for dirpath, dirs, files in os.walk(path):
            for name in dirs:
                os.chmod(os.path.join(dirpath, name), 0o755)
            for name in files:
                os.chmod(os.path.join(dirpath, name), 0o644)
        shutil.rmtree(path)


def _reader_group(root: Path) -> None:
    """Give the spool to the reader's group (`nobody`'s primary group, which `_as_reader`
    keeps when it drops to `nobody`); without root, our own group is the spool's already."""
    if not AS_ROOT:
        return
    gid = pwd.getpwnam("nobody").pw_gid
    for dirpath, _dirs, files in os.walk(root):
        os.chown(dirpath, -1, gid)
        for name in files:
            os.chown(os.path.join(dirpath, name), -1, gid)


def test_init_access_group_read_lets_the_group_read_later_jobs_and_write_nothing(
        base: Path) -> None:
    root = base / "spool"
    assert run_cli("init", "--access", "group-read", root=root).code == 0
    _reader_group(root)
    with make_spool(root) as spool:  # written after the grant: the spool's mode, the group kept
        first = spool.enqueue("mail", {"to": "a@example.com"}).id
        spool.complete(spool.claim()[0], {"sent": True})
        later = spool.enqueue("mail", {"to": "b@example.com"}).id
    for command in (["list", "--json"], ["health", "--json"]):  # loads what the child needs
        assert _as_owner(["--root", str(root), *command])["code"] == 0
    modes = {p.name: p.stat().st_mode & 0o7777 for p in root.rglob("*.json")
             if p.parent.name in ("ready", "completed")}
    assert set(modes.values()) == {0o640}, modes
    assert (root / "ready").stat().st_mode & 0o7777 == 0o2750
    listed = _as_reader(["--root", str(root), "list", "--json"])
    assert listed["code"] == 0, listed
    assert {j["id"] for j in orjson.loads(listed["out"])} == {first, later}
    assert listed["err"] == ""
    health = _as_reader(["--root", str(root), "health", "--json"])
    assert health["code"] == 0, health
    refused = _as_reader(["--root", str(root), "enqueue", "mail", "{}"])
    if AS_ROOT:  # without root we own the spool, so nothing stops our writes
        assert refused["code"] == 2 and "not writable" in refused["err"], refused


def test_a_reader_who_may_not_open_a_job_file_is_told_so_not_to_run_recover(
        base: Path) -> None:
    root = base / "spool"
    with make_spool(root) as spool:
        spool.enqueue("mail", {}, job_id="granted")
    for dirpath, _dirs, files in os.walk(root):  # a one-time grant, as `chmod -R o+rX` does
        os.chmod(dirpath, 0o755 if AS_ROOT else 0o555)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644 if AS_ROOT else 0o444)
    with make_spool(root) as spool:
        spool.enqueue("mail", {}, job_id="later")  # written with the spool's own mode, 0600
    assert _as_owner(["--root", str(root), "health", "--json"])["code"] == 0  # warm imports
    if not AS_ROOT:
        os.chmod(root / "ready" / "later.json", 0)
    got = _as_reader(["--root", str(root), "health", "--json"])
    assert got["code"] == 2, got
    reasons = orjson.loads(got["out"])["reasons"]
    assert [r["code"] for r in reasons] == ["no_read_access"], reasons
    assert "ready/later.json" in reasons[0]["message"]
    assert "--access group-read" in reasons[0]["message"]
    if not AS_ROOT:
        os.chmod(root / "ready" / "later.json", 0o600)
    with make_spool(root) as spool:  # the owner sees a healthy spool: nothing is damaged
        assert check_health(spool).ok


def test_the_skip_warning_for_a_file_this_user_may_not_read_does_not_send_them_to_recover(
        ) -> None:
    from jobspool.errors import CorruptFileWarning
    from jobspool.queue.unreadable import report_unreadable

    with pytest.warns(CorruptFileWarning) as denied:
        report_unreadable("ready", "later", os.strerror(errno.EACCES))
    with pytest.warns(CorruptFileWarning) as damaged:
        report_unreadable("ready", "broken", "bad JSON")
    assert "may not read" in str(denied[0].message)
    assert "recover" not in str(denied[0].message)
    assert "`jobspool recover` moves it to quarantine/" in str(damaged[0].message)
