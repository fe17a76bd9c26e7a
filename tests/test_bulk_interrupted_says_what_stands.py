"""An interrupted bulk `cancel`/`requeue` says how many jobs it had moved: they stay moved
(tests/store_params.py: both stores).

Found by an operator probe: `cancel --kind ok` on 20,000 jobs, SIGINT after 1.5 s, said
only "interrupted by SIGINT; what was done before it stands" (and `--json` nothing more)
while 11,500 jobs had been canceled. Here the signal comes in the middle of the action's
third step, as a real one would (`signal.raise_signal`)."""

from __future__ import annotations

import signal
from typing import Any

import orjson
import pytest

from jobspool import JobState, Spool
from jobspool.cli import main
from jobspool.pg import admin
from jobspool.queue import bulk


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, spool_store: str, step: int) -> None:
    """SIGINT inside the `step`-th unit of work: a chunk's commit on the file store (the
    signal is held to the chunk's end, so the chunk lands), just after one job's move
    committed on PostgreSQL (the move landed, and its call had not returned)."""
    calls = [0]
    if spool_store == "file":
        from jobspool.queue.journal import Journal

        real = Journal.commit_changes

        def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == step:
                signal.raise_signal(signal.SIGINT)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Journal, "commit_changes", commit)
        monkeypatch.setattr(bulk, "CHUNK", 5)
    else:
        real_move = vars(admin)["_move_one"]  # the one step a move is

        def move(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            got = real_move(*args, **kwargs)
            if calls[0] == step:
                signal.raise_signal(signal.SIGINT)
            return got

        monkeypatch.setattr(admin, "_move_one", move)


@pytest.mark.parametrize("as_json", [False, True])
def test_an_interrupted_bulk_cancel_says_how_many_it_canceled(
        spool_store: str, store_root: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], as_json: bool) -> None:
    with Spool(store_root) as spool:
        spool.enqueue_many("ok", [{"i": i} for i in range(40)])
    _interrupt_at(monkeypatch, spool_store, 3)
    argv = ["--root", str(store_root), *(["--json"] if as_json else []),
            "cancel", "--kind", "ok"]
    assert main(argv) == 130
    captured = capsys.readouterr()
    with Spool(store_root) as spool:
        canceled = spool.stats().counts[JobState.CANCELED.value]
    # File store: the chunk the signal came in landed, and none after it (3 chunks of 5),
    # all counted; PostgreSQL: three moves, the third in flight as the signal came, named.
    if spool_store == "file":
        assert canceled == 15
        said = "canceled 15 job(s)"
    else:
        assert canceled == 3
        with Spool(store_root) as spool:
            third = sorted(j.id for j in spool.jobs(JobState.CANCELED))[-1]
        said = (f"canceled 2 job(s); job {third} was in flight (`jobspool show {third}` "
                "says where it is)")
    if as_json:
        doc = orjson.loads(captured.out)
        assert doc["exit"] == 130 and doc["error"].endswith(said), doc
    else:
        assert captured.err.strip() == ("jobspool: error: interrupted by SIGINT; what was "
                                        f"done before it stands: {said}")


def test_a_bulk_cancel_cut_off_while_writing_its_output_says_what_it_did_on_stderr(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A signal while stdout is blocked (a slow reader's full pipe) after the work was done:
    the line says the count, and no error document follows half of the output."""
    root = tmp_path / "s"
    with Spool(root) as spool:
        spool.enqueue_many("ok", [{"i": i} for i in range(30)])

    class Blocked:
        def __init__(self) -> None:
            self.written = ""

        def write(self, text: str) -> int:
            self.written += text[:40]  # part of it went out, then the signal came
            raise KeyboardInterrupt

        def flush(self) -> None:
            pass

    out = Blocked()
    monkeypatch.setattr("sys.stdout", out)
    assert main(["--root", str(root), "--json", "cancel", "--kind", "ok"]) == 130
    assert '"canceled"' in out.written and "error" not in out.written
    assert capsys.readouterr().err.strip() == (
        "jobspool: error: interrupted by SIGINT; what was done before it stands: "
        "canceled 30 job(s)")
    with Spool(root) as spool:
        assert spool.stats().counts[JobState.CANCELED.value] == 30
