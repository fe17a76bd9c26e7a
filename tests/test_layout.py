"""The spool directory itself: what opening it creates, checks and refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool.errors import SpoolError
from tests.spools import make_spool


def test_opening_a_non_empty_directory_that_is_not_a_spool_is_refused_untouched(
        tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the user's own file")
    with pytest.raises(SpoolError, match="not empty and is not a spool") as info:
        make_spool(tmp_path)
    assert "notes.txt" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_half_created_spool_is_completed_not_refused(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "ready").mkdir()
    (root / ".lock").write_bytes(b"")
    with make_spool(root) as spool:
        assert spool.enqueue("note").state.value == "ready"
    assert (root / "spool.json").is_file()


def test_settings_given_at_creation_are_the_defaults_of_later_openers(tmp_path: Path) -> None:
    root = tmp_path / "s"
    make_spool(root, lease_seconds=12.5, max_attempts=3).close()
    with make_spool(root) as again:
        assert again.lease_seconds == 12.5
        assert again.max_attempts == 3
    with make_spool(root, max_attempts=7) as override:
        assert override.max_attempts == 7


def test_create_false_on_a_missing_spool_names_it(tmp_path: Path) -> None:
    with pytest.raises(SpoolError, match="does not exist"):
        make_spool(tmp_path / "nope", create=False)
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize(("edit", "named"), [
    ({"lease_seconds": 0}, "lease_seconds must be a positive"),
    ({"max_attempts": "five"}, "max_attempts"),
    ("not an object", "'settings' is not an object"),
    ({"access": "public"}, "access must be one of"),  # it named no file (operator probe)
])
def test_a_bad_hand_edited_setting_names_spool_json(
        tmp_path: Path, edit: object, named: str) -> None:
    """The error points at the file the operator edited, not at an option nobody passed;
    the CLI exits 2 (a spool problem) with one line, `health` and `fsck` too."""
    import orjson

    from tests.cli_harness import run_cli

    root = tmp_path / "s"
    make_spool(root).close()
    doc = orjson.loads((root / "spool.json").read_bytes())
    if isinstance(edit, dict):
        doc["settings"].update(edit)
    else:
        doc["settings"] = edit
    (root / "spool.json").write_bytes(orjson.dumps(doc))
    with pytest.raises(SpoolError) as info:
        make_spool(root)
    assert str(root / "spool.json") in str(info.value) and named in str(info.value)
    for command in ("stats", "health", "fsck"):
        code, _out, err = run_cli(command, root=root)
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, err)
        assert "spool.json" in err
    if isinstance(edit, dict) and "access" not in edit:  # access is fixed at creation
        # An option given by the caller wins over the broken stored one.
        field = next(iter(edit))
        make_spool(root, **{field: 30 if field == "lease_seconds" else 3}).close()


def test_a_spool_deleted_while_open_is_named_in_one_line_and_found_again_once_remade(
        tmp_path: Path) -> None:
    # Found in the robustness pass: readers raised a raw FileNotFoundError for `ready/`,
    # and a lock whose reopen failed was left with closed descriptors, so every later
    # call said "file descriptor cannot be a negative integer", even once remade.
    import shutil

    root = tmp_path / "spool"
    spool = make_spool(root)
    spool.enqueue("k", job_id="a")
    shutil.rmtree(root)
    for call in (lambda: list(spool.jobs()), spool.claim, spool.stats,
                 lambda: spool.get("a")):
        with pytest.raises(SpoolError, match=f"^{root}: the spool directory is missing"):
            call()
    make_spool(root).close()  # made again at its path
    assert list(spool.jobs()) == []
    spool.enqueue("k", job_id="b")
    assert [lease.job_id for lease in spool.claim()] == ["b"]
    spool.close()


def test_an_unknown_setting_in_spool_json_is_named_in_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Found in a recovery pass: a misspelled setting ("max_attemps") silently kept the
    # default.
    import orjson

    root = tmp_path / "spool"
    make_spool(root).close()
    doc = orjson.loads((root / "spool.json").read_bytes())
    doc["settings"]["max_attemps"] = 9
    (root / "spool.json").write_bytes(orjson.dumps(doc))
    with caplog.at_level("WARNING", logger="jobspool"):
        make_spool(root).close()
    assert any("'max_attemps'" in r.getMessage() and "ignored" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("inside", ["tmp/inner", "ready/inner", "leased/deep/inner",
                                    "quarantine/inner"])
def test_a_new_spool_inside_another_spools_own_directories_is_refused(
        tmp_path: Path, inside: str) -> None:
    # It was made; the outer spool's recover then deleted it (tmp/) or quarantined it.
    outer = tmp_path / "outer"
    with make_spool(outer) as spool:
        spool.recover()  # makes the lazy directories (quarantine/) as a user's boot would
    top = outer / inside.split("/")[0]
    before = sorted(p.name for p in top.iterdir())
    with pytest.raises(SpoolError, match=f"inside the spool .*own {top.name}/"):
        make_spool(outer / inside)
    assert sorted(p.name for p in top.iterdir()) == before  # nothing made


def test_a_new_spool_beside_the_state_directories_of_another_is_fine(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    make_spool(outer).close()
    for inner in (outer / "index" / "spool", outer / "spools" / "b"):
        with make_spool(inner) as spool:
            assert spool.enqueue("k", {}).id


_OPENER = """
import logging, sys, time
logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
from jobspool.queue import layout
saved = layout.Layout.save_settings
def slow_save(self, settings):  # widens the window after spool.json is written
    saved(self, settings)
    time.sleep(0.3)
layout.Layout.save_settings = slow_save
from jobspool import Spool
root, go = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, go - time.time()))
with Spool(root, max_attempts=int(sys.argv[3])) as spool:
    spool.enqueue("k", job_id="j" + sys.argv[3])
"""


def test_processes_creating_one_spool_at_once_make_it_once_without_false_alarms(
        tmp_path: Path) -> None:
    # Found probing producers: openers racing on a new root saw it half made, one taking
    # spool.json without its fence for a lost fence ("fence is missing", tokens restarted
    # ~1e15 up), another the reverse for a deleted spool.json; each wrote its own settings.
    import subprocess
    import sys
    import time

    from jobspool import Spool
    from tests.subproc import REPO, cli_env

    root = tmp_path / "new" / "spool"
    (tmp_path / "new").mkdir()
    go = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", _OPENER, str(root), str(go), str(n)],
                              cwd=REPO, env=cli_env(), stderr=subprocess.PIPE, text=True)
             for n in range(3, 9)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errs
    assert all("missing" not in e for e in errs), errs
    with Spool(root) as spool:
        assert sorted(j.id for j in spool.jobs()) == [f"j{n}" for n in range(3, 9)]
        assert spool.fence_value() == 0  # nothing claimed: no jump


def test_a_creation_cut_short_after_the_fence_opens_without_a_deleted_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The fence is written before spool.json (the mark of a finished spool): a crash
    # between the two left a fence at 0 and no job, which is no spool.json "deleted".
    import logging
    import stat as stat_mod

    root = tmp_path / "s"
    with make_spool(root, access="group"):
        pass
    (root / "spool.json").unlink()
    with caplog.at_level(logging.WARNING), make_spool(root) as spool:
        assert spool.enqueue("k").state.value == "ready"
        assert spool.settings.access == "group"  # its creator's, not a default opener's
    assert not [r for r in caplog.records if "missing" in r.getMessage()]
    assert (root / "spool.json").is_file()
    assert stat_mod.S_IMODE(root.stat().st_mode) == 0o2770


_SLOW_CREATOR = """
import sys, time
from jobspool.queue import journal
ensure = journal.Journal._ensure_fence
def slow(self, layout):  # widens the window between making the root and its fence
    time.sleep(float(sys.argv[3]))
    ensure(self, layout)
journal.Journal._ensure_fence = slow
from jobspool import Spool
root, go = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, go - time.time()))
kw = {"access": sys.argv[4]} if sys.argv[4] != "-" else {}
with Spool(root, **kw) as spool:
    spool.enqueue("k", job_id="j" + sys.argv[5])
"""


def test_a_second_creator_waits_even_when_the_first_made_the_missing_parents(
        tmp_path: Path) -> None:
    # Found probing this change: the lock was on "the nearest existing directory above
    # the root", which moved down once the first creator made the missing parents; the
    # second locked that one, never waited, and chmod'ed a group spool private.
    import stat as stat_mod
    import subprocess
    import sys
    import time

    from tests.subproc import REPO, cli_env

    root = tmp_path / "a" / "b" / "spool"
    go = time.time() + 1.5
    args = [(go, "1.0", "group", "1"), (go + 0.3, "0", "-", "2")]
    procs = [subprocess.Popen([sys.executable, "-c", _SLOW_CREATOR, str(root), str(at), pause,
                               access, n], cwd=REPO, env=cli_env(), stderr=subprocess.PIPE,
                              text=True) for at, pause, access, n in args]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert stat_mod.S_IMODE(root.stat().st_mode) == 0o2770
    for path in (root / "fence", *sorted((root / "ready").iterdir())):
        assert stat_mod.S_IMODE(path.stat().st_mode) & 0o060 == 0o060, path
    with make_spool(root) as spool:
        assert spool.settings.access == "group"
        assert sorted(j.id for j in spool.jobs()) == ["j1", "j2"]


_KILLED_CREATOR = """
import sys, time
from jobspool.queue import journal, layout
def stall(*args):  # the step it is killed in: say so, then never finish
    open(sys.argv[3], "w").close()
    time.sleep(300)
if sys.argv[2] == "before-fence":
    journal.Journal._ensure_fence = stall
else:
    layout.Layout.save_settings = stall
from jobspool import Spool
Spool(sys.argv[1], access="group")
"""


@pytest.mark.parametrize("where", ["before-fence", "before-spool-json"])
def test_a_creator_killed_mid_creation_leaves_a_spool_the_next_opener_completes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str) -> None:
    import logging
    import signal
    import stat as stat_mod
    import subprocess
    import sys

    from tests.subproc import REPO, cli_env
    from tests.waiting import wait_until

    root, ready = tmp_path / "a" / "spool", tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_CREATOR, str(root), where,
                             str(ready)], cwd=REPO, env=cli_env())
    try:
        wait_until(ready.exists, 60, "the creator to reach the step", proc=proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    assert not (root / "spool.json").exists()
    with caplog.at_level(logging.WARNING), make_spool(root) as spool:
        spool.enqueue("k", job_id="j")
        assert spool.settings.access == "group"
        (lease,) = spool.claim()
        assert lease.token == 1
    assert not [r.getMessage() for r in caplog.records if "missing" in r.getMessage()]
    assert stat_mod.S_IMODE(root.stat().st_mode) == 0o2770
