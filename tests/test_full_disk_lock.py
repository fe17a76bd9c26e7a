"""A full disk is an error, never a SIGBUS.

The lock file is memory-mapped; made with `ftruncate` alone it was sparse, its pages
given disk blocks only when first written through the map — on a full disk, a SIGBUS:
producers and workers died with exit 135 and no message, one of them after publishing
its job (a retry without an id then made a duplicate). The file is allocated at open.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobspool import Spool
from jobspool.queue.lock import _MAP_SIZE

REPO = str(Path(__file__).resolve().parents[1])


def test_the_lock_file_has_its_blocks_from_the_start(tmp_path: Path) -> None:
    Spool(tmp_path / "s").close()
    st = os.stat(tmp_path / "s" / ".lock")
    assert st.st_size >= _MAP_SIZE and st.st_blocks * 512 >= _MAP_SIZE


def test_a_sparse_lock_file_of_an_older_spool_is_allocated_at_open(tmp_path: Path) -> None:
    Spool(tmp_path / "s").close()
    lock = tmp_path / "s" / ".lock"
    lock.unlink()
    with open(lock, "wb") as f:
        f.truncate(_MAP_SIZE)  # sparse, as releases before this one made it
    assert os.stat(lock).st_blocks * 512 < _MAP_SIZE
    Spool(tmp_path / "s").close()
    assert os.stat(lock).st_blocks * 512 >= _MAP_SIZE


SCENARIO = textwrap.dedent('''
    set -u
    mount -t tmpfs -o size=2m tmpfs "$DIR"
    py() {{ PYTHONPATH={repo} {python} "$@"; }}
    py -m jobspool --root "$DIR/s" init >/dev/null
    py -c "
    import sys; from jobspool import Spool
    s = Spool(sys.argv[1])
    for i in range(51): s.enqueue('note', {{'i': i}}, job_id=f'a{{i}}')
    " "$DIR/s"
    dd if=/dev/zero of="$DIR/filler" bs=4k 2>/dev/null
    truncate -s -8192 "$DIR/filler"   # two pages left
    for i in 51 52 53 54 55 56 57 58; do
      py -m jobspool --root "$DIR/s" enqueue note "{{\\"i\\": $i}}" --id a$i >/dev/null 2>>"$DIR/../err"
      echo "a$i $?"
    done
    ls "$DIR/s/ready" | sed 's/.json$//' | sort > "$DIR/../ready"
''')


def _on_a_small_tmpfs(scenario: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run a shell scenario with a 2 MiB tmpfs at $DIR, in a mount namespace of its own:
    the tmpfs goes away with it, whatever happens."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = scenario.format(repo=REPO, python=sys.executable)
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          env={**os.environ, "DIR": str(mnt)}, capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done


def test_enqueues_on_a_full_disk_exit_with_an_error_or_publish(tmp_path: Path) -> None:
    done = _on_a_small_tmpfs(SCENARIO, tmp_path)
    codes = dict(line.split() for line in done.stdout.splitlines())
    ready = set((tmp_path / "ready").read_text().split())
    assert len(codes) == 8
    for job_id, code in codes.items():
        assert code in ("0", "2"), (job_id, code)  # 135: SIGBUS
        assert (job_id in ready) == (code == "0"), (job_id, code)
    assert "2" in codes.values()  # the disk did fill
    errors = (tmp_path / "err").read_text().splitlines()
    assert errors and all(e.startswith("jobspool: error:") for e in errors), errors


DRAIN = textwrap.dedent('''
    set -u
    mount -t tmpfs -o size=2m tmpfs "$DIR"
    py() {{ PYTHONPATH={repo} {python} "$@"; }}
    py -m jobspool --root "$DIR/s" init >/dev/null
    head -c 131072 /dev/zero > "$DIR/filler"
    py -c "
    import sys; from jobspool import Spool
    from jobspool.errors import WriteFailed
    s = Spool(sys.argv[1])
    n = 0
    try:
        while True:
            s.enqueue('work', {{'i': n, 'pad': 'x' * 600}}); n += 1
    except WriteFailed:
        print(n)
    " "$DIR/s" > "$DIR/../enqueued"
    truncate -s 0 "$DIR/filler"  # 32 pages back: room for a few new files, not 50
    py -m jobspool --root "$DIR/s" run-until-idle --app tests.apps.simple:app \\
        >/dev/null 2>"$DIR/../err"
    echo $? > "$DIR/../rc"
    ls "$DIR/s/completed" | wc -l > "$DIR/../completed"
''')


def test_a_nearly_full_disk_drains_in_smaller_claims(tmp_path: Path) -> None:
    # A claim writes all of its batch before retiring the old files: freeing less than a
    # batch's worth of space left a worker failing every claim of 50 (exit 2 after five)
    # while one at a time would drain the spool.
    _on_a_small_tmpfs(DRAIN, tmp_path)
    enqueued = int((tmp_path / "enqueued").read_text())
    assert enqueued > 100
    assert (tmp_path / "rc").read_text().strip() == "0", (tmp_path / "err").read_text()
    assert int((tmp_path / "completed").read_text()) == enqueued


def test_a_file_size_limit_under_the_lock_file_is_one_line(tmp_path: Path) -> None:
    # RLIMIT_FSIZE under 88 KiB: `Spool(new_root)` raised a bare OSError from ftruncate,
    # and the CLI said only "File too large", naming nothing.
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    done = subprocess.run([sys.executable, "-m", "jobspool", "--root", str(tmp_path / "s"),
                           "init"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          preexec_fn=limit)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and ".lock" in done.stderr, done.stderr
    probe = subprocess.run([sys.executable, "-c", "import sys; from jobspool import Spool\n"
                            "try:\n Spool(sys.argv[1])\nexcept Exception as e:\n"
                            " print(type(e).__name__)", str(tmp_path / "t")],
                           cwd=REPO, capture_output=True, text=True, timeout=120,
                           preexec_fn=limit)
    assert probe.stdout.strip() == "SpoolError", probe.stdout + probe.stderr


def test_recover_on_a_full_disk_prunes_then_goes_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its writing steps failed (ENOSPC) before the one that frees space, pruning, and it
    # told the operator to free space and run recover: the same failure again.
    import errno

    import jobspool.recovery.recover as recover_mod
    from jobspool.errors import WriteFailed

    with Spool(tmp_path / "s", keep_terminal=2) as spool:
        for _ in range(10):
            spool.enqueue("k", {})
            (lease,) = spool.claim()
            spool.complete(lease, {"ok": True})
        real = getattr(recover_mod, "_reclaim")  # noqa: B009 - the step a full disk fails
        calls: list[int] = []

        def full_once(*args: object, **kwargs: object) -> object:
            calls.append(1)
            if len(calls) == 1:
                raise WriteFailed("No space left on device", errno=errno.ENOSPC)
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(recover_mod, "_reclaim", full_once)
        spool.recover()
        assert len(calls) == 2 and spool.stats()["completed"] == 2
