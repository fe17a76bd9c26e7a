"""What the Worker costs over the raw batched calls it makes, on one store, in one run.

    .venv/bin/python -m bench.worker_overhead [--jobs 5000] [--rounds 3] [--url postgresql://...]

Per round, on fresh spools filled the same way (`enqueue_many` of 50, ~512-byte payloads):
- raw: `claim(kinds, limit=50)` + `complete_many` in a loop until empty (batched);
- Worker, sync no-op handler, `batch_size=50` (batched), `run_until_idle()`;
- Worker, async no-op handler, the same.
Without `--url` the file spool runs with `durable=False`, so what is compared is the
Python path (the flushes would otherwise dominate both). With `--url` each spool is a fresh
database on that server. Rounds are interleaved; the ratios (Worker ÷ raw) are medians of
per-round ratios: absolute rates drift on a shared machine, ratios much less.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from jobspool import Spool, Worker  # noqa: E402

BATCH = 50


def _sync_noop(job: Any, ctx: Any) -> None:
    return None


async def _async_noop(job: Any, ctx: Any) -> None:
    return None


def _spool_factory(url: str | None, work: Path) -> Callable[[], Any]:
    if url is None:
        return lambda: Spool(work / uuid.uuid4().hex[:8], durable=False)
    import psycopg

    def fresh() -> Any:
        name = "wo_" + uuid.uuid4().hex[:8]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return Spool(url.rsplit("/", 1)[0] + "/" + name)

    return fresh


def _filled(make: Callable[[], Any], n: int) -> Any:
    spool = make()
    for start in range(0, n, BATCH):
        spool.enqueue_many("noop", [{"i": i, "pad": "x" * 512}
                                    for i in range(start, min(n, start + BATCH))])
    return spool


def _raw(spool: Any) -> float:
    done, t = 0, time.perf_counter()
    while leases := spool.claim(kinds=["noop"], limit=BATCH):
        spool.complete_many([(lease, None) for lease in leases])
        done += len(leases)
    return done / (time.perf_counter() - t)


def _worker(spool: Any, handler: Callable[..., Any]) -> float:
    worker = Worker(spool, handlers={"noop": handler}, batch_size=BATCH)
    t = time.perf_counter()
    report = worker.run_until_idle()
    return report.completed / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.worker_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--url", help="a PostgreSQL server URL (its databases wo_* are created)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="worker-overhead-", dir=str(REPO / "bench")))
    make = _spool_factory(a.url, work)
    rates: dict[str, list[float]] = {"raw": [], "sync": [], "async": []}
    try:
        for rnd in range(a.rounds):
            order = ["raw", "sync", "async"]
            order = order[rnd % 3:] + order[:rnd % 3]  # rotate who goes first
            for what in order:
                spool = _filled(make, a.jobs)
                rates[what].append(_raw(spool) if what == "raw" else
                                   _worker(spool, _sync_noop if what == "sync" else _async_noop))
                spool.close()
            print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s"
                                                   for k, v in rates.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    store = "PostgreSQL" if a.url else "file spool, durable=False"
    print(f"\n{store}, {a.jobs} jobs per run, {a.rounds} interleaved rounds, batches of {BATCH}")
    print("| batched, no-op handler | jobs/s (median) | ÷ raw (median of rounds) |\n|---|---:|---:|")
    for what in rates:
        ratio = statistics.median(x / y for x, y in zip(rates[what], rates["raw"], strict=True))
        print(f"| {what} | {statistics.median(rates[what]):,.0f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
