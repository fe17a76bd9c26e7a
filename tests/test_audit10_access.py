"""Issue 10 item 9 (and item 1's saved size), audited from the command line and the API.

Found in the audit:
- `jobspool init` had no way to ask for a group spool or a size limit, though
  both are creation settings saved in `spool.json` (the README's "explicit
  option" existed in the Python API only);
- `Spool(root, access=...)` on an existing spool ignored the argument without a
  word, even a bad value (`access="bogus"`), so a service asking for a group
  spool silently got a private one;
- the files that hold the spool's control state were not checked: a
  world-writable `.lock` (whose shared memory hands out fencing tokens),
  `fence` or `spool.json` let any local user reissue tokens or change the
  settings, where a world-writable state directory was already refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest

from jobspool.errors import JobTooLarge, SpoolError
from tests.cli_harness import one_error_line, run_jobspool
from tests.spools import make_spool


def _settings(root: Path) -> dict[str, object]:
    doc = orjson.loads((root / "spool.json").read_bytes())
    assert isinstance(doc, dict)
    return dict(doc["settings"])


def test_init_access_group_makes_a_group_spool_and_saves_it(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    proc = run_jobspool("init", "--access", "group", root=root)
    assert proc.returncode == 0, proc.stderr
    assert _settings(root)["access"] == "group"
    assert stat.S_IMODE(root.stat().st_mode) == 0o2770
    assert stat.S_IMODE((root / "ready").stat().st_mode) & 0o777 == 0o770
    assert stat.S_IMODE((root / "spool.json").stat().st_mode) == 0o660
    proc = run_jobspool("enqueue", "work", "{}", "--id", "j1", root=root)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((root / "ready" / "j1.json").stat().st_mode) == 0o660


def test_init_without_access_is_private(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    assert run_jobspool("init", root=root).returncode == 0
    assert _settings(root)["access"] == "private"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_init_refuses_an_unknown_access_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    proc = run_jobspool("init", "--access", "world", root=root)
    assert proc.returncode == 1
    assert "world" in one_error_line(proc)
    assert not root.exists()


def test_init_max_job_bytes_is_saved_and_enforced(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    proc = run_jobspool("init", "--max-job-bytes", "8192", root=root)
    assert proc.returncode == 0, proc.stderr
    assert _settings(root)["max_job_bytes"] == 8192
    proc = run_jobspool("enqueue", "work", orjson.dumps({"p": "x" * 9000}).decode(), root=root)
    assert proc.returncode == 1
    assert "8192" in one_error_line(proc)
    with make_spool(root) as spool, pytest.raises(JobTooLarge):
        spool.enqueue("work", {"p": "x" * 9000})


def test_init_refuses_a_max_job_bytes_below_the_minimum(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    proc = run_jobspool("init", "--max-job-bytes", "10", root=root)
    assert proc.returncode == 1
    assert "10" in one_error_line(proc)
    assert not root.exists()


def test_asking_an_existing_spool_for_another_access_is_refused_in_one_line(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    with pytest.raises(SpoolError) as info:
        make_spool(root, access="group")
    message = str(info.value)
    assert "private" in message and "group" in message and "\n" not in message
    assert _settings(root)["access"] == "private"
    with make_spool(root, access="private") as same:  # asking for what it is: fine
        assert same.access == "private"
    proc = run_jobspool("init", "--access", "group", root=root)
    assert proc.returncode == 2
    assert "private" in one_error_line(proc)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_a_bad_access_is_refused_on_an_existing_spool_too(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    with pytest.raises(SpoolError, match="bogus"):
        make_spool(root, access="bogus")


@pytest.mark.parametrize("name", [".lock", "fence", "spool.json"])
def test_a_control_file_writable_by_every_user_is_refused_with_one_line(
        tmp_path: Path, name: str) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("work", {}, job_id="j1")
    path = root / name
    os.chmod(path, stat.S_IMODE(path.stat().st_mode) | stat.S_IWOTH)
    with pytest.raises(SpoolError) as info:
        make_spool(root)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    proc = run_jobspool("enqueue", "work", "{}", "--id", "j2", root=root)
    assert proc.returncode == 2
    assert str(path) in one_error_line(proc)
    assert not (root / "ready" / "j2.json").exists()
    os.chmod(path, stat.S_IMODE(path.stat().st_mode) & ~stat.S_IWOTH)
    with make_spool(root) as spool:  # fixed as the message says: usable again
        assert spool.get("j1").state == "ready"
