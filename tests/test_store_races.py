"""Races between processes on one store, run on both stores (tests/store_params.py): the same
ids enqueued and prepared by several processes at once, and cancel racing complete. Each child
prints what the API told it; the store's final state must agree with every answer."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from jobspool import JobState, Spool
from tests.subproc import REPO, cli_env

pytestmark = pytest.mark.slow
MakeSpool = Callable[..., Spool]

_CHILD = """
import sys, orjson
from jobspool import Spool
from jobspool.errors import JobspoolError
root, what, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = []
with Spool(root) as spool:
    print("ready", flush=True)  # opened: the race starts now
    for i in range(n):
        if what == "enqueue":
            r = spool.enqueue_result("note", {"by": sys.argv[4]}, job_id=f"j{i}")
            out.append([r.job.id, r.outcome, r.job.payload["by"]])
        elif what == "prepare":
            r = spool.prepare("note", job_id="shared")
            out.append([r.job_id, r.reservation_id, str(r.job.state)])
        elif what == "cancel":
            try:
                out.append([f"j{i}", str(spool.cancel(f"j{i}").state)])
            except JobspoolError as exc:
                out.append([f"j{i}", type(exc).__name__])
print(orjson.dumps(out).decode(), flush=True)
"""


def _children(root: str, what: str, n: int, count: int) -> list[list[list[str]]]:
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, root, what, str(n), f"p{k}"],
                              cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for k in range(count)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err.decode(errors="replace")
        outs.append(orjson.loads(out.splitlines()[-1]))
    return outs


def test_the_same_ids_enqueued_by_four_processes_are_created_once_each(
        make_any_spool: MakeSpool, store_root: str | Path) -> None:
    make_any_spool()  # create the store before the children race to
    outs = _children(str(store_root), "enqueue", 150, 4)
    created = Counter(job_id for out in outs for job_id, outcome, _ in out if outcome == "created")
    assert created == Counter({f"j{i}": 1 for i in range(150)})
    assert {outcome for out in outs for _, outcome, _ in out} == {"created", "existing"}
    spool = make_any_spool()
    for out in outs:
        for job_id, _, by in out:
            # Every process was told the payload that is stored: the creator's.
            assert spool.get(job_id).payload == {"by": by}
    assert len(list(spool.jobs())) == 150


def test_reservations_prepared_by_four_processes_at_once_are_all_kept(
        make_any_spool: MakeSpool, store_root: str | Path) -> None:
    from jobspool import Reservation

    make_any_spool()
    outs = _children(str(store_root), "prepare", 25, 4)
    ids = [rid for out in outs for _, rid, state in out if state == "prepared"]
    assert len(ids) == 100 and len(set(ids)) == 100
    spool = make_any_spool()
    job = spool.get("shared")
    assert job.state is JobState.PREPARED and set(job.reservations) == set(ids)
    for rid in ids[:-1]:
        spool.abort(Reservation(job_id="shared", reservation_id=rid, job=job))
    assert spool.get("shared").state is JobState.PREPARED  # one producer still holds it
    spool.abort(Reservation(job_id="shared", reservation_id=ids[-1], job=job))
    assert spool.get("shared").state is JobState.CANCELED


def test_cancel_racing_complete_leaves_each_job_as_its_winner_was_told(
        make_any_spool: MakeSpool, store_root: str | Path) -> None:
    spool = make_any_spool(lease_seconds=120.0)
    spool.enqueue_many("note", [None] * 200, job_ids=[f"j{i}" for i in range(200)])
    leases = spool.claim(limit=200)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(store_root), "cancel", "200", "x"],
                            cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    completed = set()
    for lease in leases:
        try:
            spool.complete(lease, "done")
            completed.add(lease.job_id)
        except Exception as exc:
            assert type(exc).__name__ == "LeaseLost", exc
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err.decode(errors="replace")
    answers = orjson.loads(out)
    canceled = {job_id for job_id, answer in answers if answer == "canceled"}
    refused = {job_id for job_id, answer in answers if answer == "InvalidTransition"}
    assert canceled | refused == {f"j{i}" for i in range(200)} and not canceled & refused
    assert completed == refused  # each job has exactly one winner, and it was told so
    for job_id in canceled:
        assert spool.get(job_id).state is JobState.CANCELED
    for job_id in completed:
        assert (spool.get(job_id).state, spool.get(job_id).result) == (JobState.COMPLETED, "done")
