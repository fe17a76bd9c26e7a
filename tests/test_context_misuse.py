"""A handler's context used where it should not be (found by an escaped-context probe).

- `ctx.lease` was a plain attribute: a handler that set it to another job's lease hung the
  run for ever (its run was filed under one id and taken out under another) and settled
  that job with its own result; one that set a forged token for an upsert and put the real
  lease back wrote a projection row fenced at 1e9, which fenced out every later write. The
  lease, its id and its token are now read-only to handlers.
- A thread the handler started and did not wait for, still inside `ctx.fenced()` after the
  handler returned, held the spool lock (the file store) or the job's row (PostgreSQL): the
  settle waited on it, and a stopped worker exited only when the block ended. The run's end
  now ends such a block, as a time limit does; a block opened after the end is refused.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, LanceProjection, Spool, Worker
from jobspool.errors import HoldCut, LeaseLost, StoreUnavailable


def test_a_handler_cannot_replace_its_lease(any_spool: Spool, tmp_path: Path) -> None:
    any_spool.enqueue("other", None, job_id="other")
    other = any_spool.claim(kinds="other")[0]
    any_spool.enqueue("k", None, job_id="j", max_attempts=1)
    seen: list[str] = []

    def handler(job: Any, ctx: Any) -> None:
        for forged in (other, dataclasses.replace(ctx.lease, token=10**9)):
            try:
                ctx.lease = forged
            except AttributeError:
                seen.append("refused")
        ctx.upsert("t", {"id": job.id, "v": 1})

    report = Worker(any_spool, {"k": handler}, projection=str(tmp_path / "index"),
                    maintenance=False).run_until_idle()
    assert seen == ["refused", "refused"]
    assert report.completed == 1
    assert any_spool.get("other").state is JobState.LEASED  # not settled by another run
    row = LanceProjection(str(tmp_path / "index"), "t").get("j")
    assert row is not None and row["fence"] <= any_spool.fence_value() < 10**9


def test_a_block_left_open_by_a_handlers_thread_is_ended_with_its_run(
        any_spool: Spool) -> None:
    any_spool.enqueue("k", None, job_id="j")
    inside, release = threading.Event(), threading.Event()
    stray: list[object] = []

    def in_block(ctx: Any) -> None:
        try:
            with ctx.fenced():
                inside.set()
                release.wait(120)
                ctx.spool.enqueue("late", None, job_id="late")  # after its run ended
                stray.append("wrote")
        except (HoldCut, LeaseLost, StoreUnavailable) as exc:
            stray.append(type(exc))

    def handler(job: Any, ctx: Any) -> str:
        threading.Thread(target=in_block, args=(ctx,), daemon=True).start()
        assert inside.wait(60)
        return "done"  # without waiting for its thread

    box: list[Any] = []
    run = threading.Thread(target=lambda: box.append(
        Worker(any_spool, {"k": handler}, maintenance=False).run_until_idle()), daemon=True)
    run.start()
    run.join(120)  # a guard against the hang, not a timing
    ended = not run.is_alive()
    release.set()
    assert ended, "the run waited for a fenced block its handler's thread left open"
    assert box[0].completed == 1
    assert any_spool.get("j").state is JobState.COMPLETED
    for _ in range(200):
        if stray:
            break
        threading.Event().wait(0.05)
    assert stray and stray[0] != "wrote", stray
    with pytest.raises(Exception):  # noqa: B017 - JobNotFound on either store
        any_spool.get("late")


def test_a_fenced_block_opened_after_the_run_ended_is_refused(any_spool: Spool) -> None:
    any_spool.enqueue("k", None, job_id="j")
    kept: list[Any] = []
    Worker(any_spool, {"k": lambda job, ctx: kept.append(ctx)}, maintenance=False
           ).run_until_idle()
    with pytest.raises(LeaseLost, match="run has ended"), kept[0].fenced():
        pass


def test_a_write_from_a_handler_given_up_on_says_so(any_spool: Spool, tmp_path: Path) -> None:
    # It was told "the handler returned", which is not what happened.
    from jobspool import Policy

    any_spool.enqueue("k", None, job_id="j", max_attempts=1)
    said: list[str] = []
    done = threading.Event()

    def handler(job: Any, ctx: Any) -> None:
        try:
            threading.Event().wait(1.5)  # past its limit of 0.5 s
            ctx.upsert("t", {"id": job.id})
        except LeaseLost as exc:
            said.append(str(exc))
        finally:
            done.set()

    Worker(any_spool, {"k": handler}, policies={"k": Policy(timeout=0.5)},
           projection=str(tmp_path / "index"), maintenance=False).run_until_idle()
    assert done.wait(60)
    assert said and "time limit" in said[0] and "returned" not in said[0], said
