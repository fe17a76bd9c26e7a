"""A damaged or hand-edited file lying where a job moves is quarantined before the move,
never renamed over.

Found by a probe: with an unreadable `completed/ready0.json` (a hand edit cut short) and
garbage in `leased/ready1.json`, a worker logged "skipping unreadable job file ...
(`jobspool recover` moves it to quarantine/)", then renamed both jobs over those files:
the hand edit was gone, quarantine/ empty and fsck clean. `requeue` did the same in ready/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool import JobState, Worker
from tests.spools import make_spool

# Each read before the move skips the damaged file, saying so: expected here.
pytestmark = pytest.mark.filterwarnings("ignore::jobspool.errors.CorruptFileWarning")

_HAND_EDIT = (b'{"v":1,"id":"a","kind":"k","payload":{"IMPORTANT":"data"},'
              b'"state":"completed","revision":9')  # cut short: not JSON


def _quarantined(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / "quarantine").iterdir()
            if not p.name.endswith(".reason")}


def test_a_worker_quarantines_what_lies_where_its_jobs_go(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="a")
        spool.enqueue("k", {}, job_id="b")
    (root / "completed" / "a.json").write_bytes(_HAND_EDIT)
    (root / "leased" / "b.json").write_bytes(b"garbage")
    with make_spool(root) as spool:
        report = Worker(spool, {"k": lambda job, ctx: "done"}).run_until_idle()
        assert report.completed == 2
        assert spool.get("a").state is JobState.COMPLETED
        assert spool.get("b").state is JobState.COMPLETED
        assert spool.fsck().ok
    kept = _quarantined(root)
    assert sorted(kept.values()) == sorted([_HAND_EDIT, b"garbage"])
    assert {name.split(".", 1)[1] for name in kept} == {"completed.a.json", "leased.b.json"}


def test_requeue_quarantines_what_lies_in_ready(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="c")
        spool.cancel("c")
    (root / "ready" / "c.json").write_bytes(b"{not json")
    with make_spool(root) as spool:
        spool.requeue("c")
        assert spool.get("c").state is JobState.READY
        assert spool.fsck().ok
    assert list(_quarantined(root).values()) == [b"{not json"]


def test_an_older_copy_of_the_same_job_is_replaced_not_quarantined(tmp_path: Path) -> None:
    """What a power loss leaves (the old copy beside the new): readable, the same job,
    an older revision. The move replaces it, as recovery would have."""
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="d")
        old_ready = (root / "ready" / "d.json").read_bytes()
        [lease] = spool.claim(limit=1, owner="w")
        (root / "ready" / "d.json").write_bytes(old_ready)  # the stale copy, back
        spool.release(lease)
        assert spool.get("d").state is JobState.READY
        assert spool.fsck().ok
    assert _quarantined(root) == {}
