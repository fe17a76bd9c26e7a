"""A/B of the hot path between two checkouts of jobspool, interleaved in the same run.

    python -m bench.ab OLD_TREE [--n 200] [--rounds 7] [--batch 1]

Each round runs, in rotating order, a fresh child process per variant (the old
checkout, this one, SQLite FULL in the same mode) doing `--n` enqueues then
`--n` claim+complete in batches of `--batch`. Prints the median of per-round
ratios (new / old, and each / SQLite): the load of a shared machine moves all
three alike within a round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
kind, root, n, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "sqlite":
    from bench.peers.sqlite_min import SqliteMinAdapter as A
    q = A(root, pad=512)
else:
    from bench.peers.jobspool_adapter import JobspoolAdapter as A
    q = A(root, pad=512)
t = time.perf_counter()
for k in range(0, n, b):
    q.enqueue(list(range(k, min(n, k + b))))
enq = n / (time.perf_counter() - t)
t = time.perf_counter(); done = 0
while done < n:
    got = q.claim(b)
    if not got:
        break
    done += len(q.complete(got))
con = done / (time.perf_counter() - t)
q.close()
print(json.dumps([enq, con]))
"""


def _child(kind: str, tree: Path, root: str, n: int, b: int) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{REPO}")
    out = subprocess.run([sys.executable, "-c", CHILD, kind, root, str(n), str(b)], env=env,
                         cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    enq, con = json.loads(out.stdout.strip().splitlines()[-1])
    return float(enq), float(con)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="path of the other checkout (e.g. a git worktree)")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batch", type=int, default=1)
    a = p.parse_args(argv)
    variants = {"old": ("jobspool", Path(a.old)), "new": ("jobspool", REPO),
                "sqlite": ("sqlite", REPO)}
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory(dir=str(REPO / "bench")) as work:
        for rnd in range(a.rounds):
            names = list(variants)
            names = names[rnd % 3:] + names[: rnd % 3]
            for name in names:
                kind, tree = variants[name]
                res[name].append(_child(kind, tree, f"{work}/{name}-{rnd}", a.n, a.batch))
    print(f"batch {a.batch}, {a.n} jobs, {a.rounds} rounds (medians of per-round ratios)")
    for i, what in enumerate(("enqueue", "claim+complete")):
        med = {k: statistics.median(r[i] for r in v) for k, v in res.items()}
        nv_old = statistics.median(n[i] / o[i] for n, o in zip(res["new"], res["old"]))
        old_sq = statistics.median(o[i] / s[i] for o, s in zip(res["old"], res["sqlite"]))
        new_sq = statistics.median(n[i] / s[i] for n, s in zip(res["new"], res["sqlite"]))
        print(f"{what:>15}: new/old {nv_old:.2f}x | vs SQLite: old {old_sq:.2f}x, "
              f"new {new_sq:.2f}x | jobs/s old {med['old']:,.0f}, new {med['new']:,.0f}, "
              f"sqlite {med['sqlite']:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
