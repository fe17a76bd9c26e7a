"""Two OS processes projecting overlapping ids into one table at the same time.

Without LanceDB's unenforced primary key, both processes insert a new key and
the table holds it twice. Two independent checks: no key appears twice in the
raw table, and every key ends at the highest (version, fence) any process
wrote for it. The deadline only guards against hangs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobspool.projection.handler import LIVE_FILTER
from jobspool.projection.lance import ProjectionStore
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent

WRITER = r"""
import sys, time
from pathlib import Path
from jobspool.projection.handler import make_upsert, make_delete
from jobspool.projection.lance import ProjectionStore

uri, me, rounds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
store = ProjectionStore(uri)
store.connection  # import lancedb and connect before the start line
Path(f"{go}.ready{me}").touch()
while not go.exists():
    time.sleep(0.005)
failures = 0
for r in range(rounds):
    writes = []
    for i in range(8):
        key = f"k{r}-{i}"
        # Both processes write every key of the round; their (version, fence)
        # pairs interleave so that neither process always wins.
        version = float(r * 10 + (i + me) % 3)
        fence = 1000 * r + 10 * i + me
        job = f"p{me}-r{r}-i{i}"
        if (i + me) % 5 == 0:
            writes.append(make_delete(job, "shared", key, version, fence))
        else:
            writes.append(make_upsert(job, "shared", {"id": key, "by": me}, version, fence))
    for attempt in range(20):
        result = store.apply(writes)
        assert not result.rejected, result.rejected
        if not result.failed:
            break
        failures += 1
    else:
        raise SystemExit(f"process {me}: round {r} kept failing: {result.failed}")
print(failures)
"""

ROUNDS = 12


def expected_winners() -> dict[str, tuple[float, int, bool]]:
    """Replay both processes' writes in the model: the highest (version, fence) wins each key."""
    best: dict[str, tuple[float, int, bool]] = {}
    for me in (1, 2):
        for r in range(ROUNDS):
            for i in range(8):
                key = f"k{r}-{i}"
                cand = (float(r * 10 + (i + me) % 3), 1000 * r + 10 * i + me, (i + me) % 5 == 0)
                if key not in best or cand[:2] >= best[key][:2]:
                    best[key] = cand
    return best


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_processes_never_duplicate_a_key_and_keep_the_highest_pair(tmp_path: Path) -> None:
    uri = str(tmp_path / "db")
    # The table exists before the race, as the first batch of a worker makes it.
    from jobspool.projection.handler import make_upsert

    assert ProjectionStore(uri).apply([make_upsert("init", "shared", {"id": "init", "by": 0}, 0.0, 0)]).ok
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, uri, str(me), str(ROUNDS), str(go)],
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": ""},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in (1, 2)
    ]
    try:
        for me, proc in zip((1, 2), procs, strict=True):
            wait_until((tmp_path / f"go.ready{me}").exists, 120, f"writer {me} to get ready",
                       proc=proc)
        go.touch()
        outputs = [p.communicate(timeout=150) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-2000:]

    raw = ProjectionStore(uri).open("shared")
    assert raw is not None
    rows = raw.to_arrow().to_pylist()
    keys = [r["id"] for r in rows]
    assert len(keys) == len(set(keys)), "a key was inserted twice"

    stored = {r["id"]: (r["version"], r["fence"], r["_deleted"]) for r in rows}
    want = expected_winners()
    assert {k: v for k, v in stored.items() if k != "init"} == want
    live = {r["id"] for r in raw.search().where(LIVE_FILTER).limit(None).to_arrow().to_pylist()}
    assert live == {k for k, v in want.items() if not v[2]} | {"init"}
