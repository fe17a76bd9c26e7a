"""Consuming from a deep backlog while another process keeps enqueueing.

`python -m bench.live_depth [--depths 1000,100000] [--jobs 3000] [--rounds 3]`

For each depth: prefill a spool (untimed, `durable=False`), open a durable
consumer on it and read its claim index (`preload`, timed apart as
start-up), start a producer process that enqueues batches of 50 for the
whole measurement, then time the consumer draining `--jobs` jobs by claim +
complete batches of 50. This is the case the ready/ change ring exists for:
every producer batch changes `ready/`, and a consumer that had to relist it
would pay a full listing of the backlog per batch. Rounds interleave the
depths; medians and the deep/shallow ratio are printed (run by hand, never
a timed test: the machine is shared and absolute figures drift).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PAD = "x" * 400


def _producer(root: str, stop: Any, started: Any) -> None:
    from jobspool import Spool

    spool = Spool(root, durable=True)
    started.set()
    while not stop.is_set():
        spool.enqueue_many("bench", [{"pad": PAD} for _ in range(50)])
        time.sleep(0.005)
    spool.close()


def measure(depth: int, jobs: int, workdir: str) -> tuple[float, float]:
    from jobspool import Spool

    root = tempfile.mkdtemp(dir=workdir) + "/spool"
    fill = Spool(root, durable=False, keep_terminal=10_000_000)
    for k in range(0, depth, 5000):
        fill.enqueue_many("bench", [{"pad": PAD} for _ in range(min(5000, depth - k))])
    fill.close()
    consumer = Spool(root, durable=True, keep_terminal=10_000_000)
    t0 = time.perf_counter()
    consumer.preload()
    startup = time.perf_counter() - t0
    ctx = mp.get_context("spawn")
    stop, started = ctx.Event(), ctx.Event()
    producer = ctx.Process(target=_producer, args=(root, stop, started))
    producer.start()
    started.wait(60)
    time.sleep(0.3)
    done = 0
    t0 = time.perf_counter()
    while done < jobs:
        leases = consumer.claim(limit=50)
        consumer.complete_many([(lease, None) for lease in leases])
        done += len(leases)
    rate = done / (time.perf_counter() - t0)
    stop.set()
    producer.join(60)
    consumer.close()
    return rate, startup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="1000,100000")
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", default=str(Path(__file__).resolve().parent / ".work"))
    args = p.parse_args()
    Path(args.workdir).mkdir(exist_ok=True)
    depths = [int(d) for d in args.depths.split(",")]
    rates: dict[int, list[float]] = {d: [] for d in depths}
    startups: dict[int, list[float]] = {d: [] for d in depths}
    for rnd in range(args.rounds):
        order = depths if rnd % 2 == 0 else list(reversed(depths))
        for depth in order:
            rate, startup = measure(depth, args.jobs, args.workdir)
            rates[depth].append(rate)
            startups[depth].append(startup)
            print(f"[r{rnd}] depth {depth:>7,}: {rate:8,.0f} jobs/s consumed with a live "
                  f"producer (start-up {startup:.2f} s)", flush=True)
    print("\n| backlog | consume jobs/s (median) | start-up s (median) |\n|---:|---:|---:|")
    for depth in depths:
        print(f"| {depth:,} | {statistics.median(rates[depth]):,.0f} | "
              f"{statistics.median(startups[depth]):.2f} |")
    lo, hi = depths[0], depths[-1]
    ratios = [h / low for h, low in zip(rates[hi], rates[lo], strict=True)]
    print(f"\n{hi:,} / {lo:,} queued, same rounds: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
