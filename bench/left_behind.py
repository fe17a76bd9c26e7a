"""What a short `run_until_idle` of one kind costs beside a backlog of another kind.

    .venv/bin/python -m bench.left_behind [--depth 20000] [--rounds 5] [--url postgresql://...]

An idle run reports what it left (due jobs of kinds it has no handler for, its own kinds'
jobs not due yet). Per round, on two spools filled the same way except for the backlog —
one with `--depth` jobs of kind "other" (~512-byte payloads, untimed), one with none — a
worker for kind "mine" drains 3 jobs; the time of that `run_until_idle` is compared, deep
against empty, in the same rounds (ratios are medians of per-round ratios; absolute times
drift on a shared machine). Without `--url` the file spool runs with `durable=False`.
A ratio near 1 means the report does not read the backlog.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from jobspool import Spool, Worker


def _noop(job: Any, ctx: Any) -> None:
    return None


def _spool(url: str | None, work: Path) -> Spool:
    if url is None:
        return Spool(work / uuid.uuid4().hex[:8], durable=False)
    import psycopg

    name = "lb_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return Spool(url.rsplit("/", 1)[0] + "/" + name)


def _filled(url: str | None, work: Path, depth: int) -> tuple[Spool, Worker]:
    spool = _spool(url, work)
    for start in range(0, depth, 500):
        spool.enqueue_many("other", [{"i": i, "pad": "x" * 512}
                                     for i in range(start, min(depth, start + 500))])
    worker = Worker(spool, {"mine": _noop}, maintenance=False)
    spool.enqueue_many("mine", [0])
    worker.run_until_idle()  # warm: imports, connections, the claim index
    return spool, worker


def _drain(spool: Spool, worker: Worker) -> float:
    spool.enqueue_many("mine", [1, 2, 3])
    t = time.perf_counter()
    report = worker.run_until_idle()
    elapsed = time.perf_counter() - t
    assert report.completed == 3, report
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--url", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobspool-lb-") as tmp:
        work = Path(tmp)
        deep = _filled(args.url, work, args.depth)
        empty = _filled(args.url, work, 0)
        times: dict[str, list[float]] = {"deep": [], "empty": []}
        for r in range(args.rounds):
            times["deep"].append(_drain(*deep))
            times["empty"].append(_drain(*empty))
            print(f"round {r + 1}: beside {args.depth:,} others {times['deep'][-1] * 1e3:.1f} ms,"
                  f" beside none {times['empty'][-1] * 1e3:.1f} ms")
        for spool, _ in (deep, empty):
            spool.close()
    ratios = [d / e for d, e in zip(times["deep"], times["empty"], strict=True)]
    store = "PostgreSQL" if args.url else "file spool (durable=False)"
    print(f"\n{store}: run_until_idle draining 3 jobs (one claim), {args.rounds} rounds")
    print("| backlog of another kind | ms (median) | ÷ no backlog (median of rounds) |")
    print("|---|---:|---:|")
    print(f"| {args.depth:,} | {statistics.median(times['deep']) * 1e3:.1f} | "
          f"{statistics.median(ratios):.2f}x |")
    print(f"| 0 | {statistics.median(times['empty']) * 1e3:.1f} | 1.00x |")


if __name__ == "__main__":
    main()
