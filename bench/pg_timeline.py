"""Where a PostgreSQL Worker's time goes, beside the raw loop it drives (issue 16).

    .venv/bin/python -m bench.pg_timeline --url postgresql://... [--jobs 20000] [--rounds 3]

Per round, on fresh databases filled the same way (`enqueue_many` of 500, ~512-byte
payloads), both batched 50 with a no-op handler:
- raw: `claim(limit=50, take_over=False)` + `complete_many` in a loop until empty;
- Worker: `Worker(batch_size=50).run_until_idle()`, its spool's `claim` and
  `complete_many` timed as they are called (in their threads).
Printed per run: jobs/s; the share of the run with a claim in flight only, a settle only,
both, neither; the median claim and settle call; the Worker's median gap between one
claim returning and the next going out. The ratios (Worker ÷ raw) are medians of
per-round ratios: absolute times drift on a shared machine, ratios much less.
A diagnostic, not a headline: its calls are wrapped, which costs both sides alike.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import pg_jobspool as pj  # noqa: E402
from jobspool import Spool, Worker  # noqa: E402

BATCH = 50


def _noop(job: Any, ctx: Any) -> None:
    return None


def _fresh(base_url: str, name: str, n: int) -> str:
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    url = base_url.rsplit("/", 1)[0] + "/" + name
    pj.setup(url)
    with Spool(url) as spool:
        for k in range(0, n, 500):
            spool.enqueue_many("bench", [pj.payload(i, 512) for i in range(k, min(n, k + 500))])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobspool_jobs")
        conn.execute("CHECKPOINT")
    return url


def _timed(spool: Any, calls: list[tuple[str, float, float]]) -> None:
    """Record (name, start, end) of every `claim` and `complete_many` made on `spool`."""
    for name in ("claim", "complete_many"):
        real = getattr(spool, name)

        def wrapped(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                calls.append((_name, t0, time.perf_counter()))

        setattr(spool, name, wrapped)


def _shares(calls: list[tuple[str, float, float]]) -> dict[str, float]:
    """Shares of the span with a claim only, a settle only, both, neither in flight."""
    edges = sorted({t for _, a, b in calls for t in (a, b)})
    out = dict.fromkeys(("claim only", "settle only", "both", "neither"), 0.0)
    for lo, hi in itertools.pairwise(edges):
        mid = (lo + hi) / 2
        c = any(n == "claim" and a <= mid < b for n, a, b in calls)
        s = any(n != "claim" and a <= mid < b for n, a, b in calls)
        out["both" if c and s else "claim only" if c else "settle only" if s else
            "neither"] += hi - lo
    span = edges[-1] - edges[0] if len(edges) > 1 else 1.0
    return {k: v / span for k, v in out.items()}


def _run(url: str, worker: bool) -> dict[str, Any]:
    calls: list[tuple[str, float, float]] = []
    with Spool(url) as spool:
        spool.enqueue_many("warm", [pj.payload(i, 0) for i in range(50)])
        Worker(spool, handlers={"warm": _noop}, batch_size=BATCH).run_until_idle()
        _timed(spool, calls)
        t = time.perf_counter()
        if worker:
            done = Worker(spool, handlers={"bench": _noop},
                          batch_size=BATCH).run_until_idle().completed
        else:
            done = 0
            while leases := spool.claim(kinds="bench", limit=BATCH, take_over=False):
                done += len(spool.complete_many([(x, None) for x in leases]))
        rate = done / (time.perf_counter() - t)
    claims = [(a, b) for n, a, b in calls if n == "claim"]
    gaps = [nxt[0] - prev[1] for prev, nxt in itertools.pairwise(claims)]
    return {"rate": rate, "shares": _shares(calls),
            "claim_ms": statistics.median(b - a for a, b in claims) * 1e3,
            "settle_ms": statistics.median(b - a for n, a, b in calls if n != "claim") * 1e3,
            "gap_ms": statistics.median(gaps) * 1e3 if gaps else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="a server whose bench_tl_* databases may go")
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    ratios = []
    for r in range(a.rounds):
        got = {}
        for which in (("raw", "worker") if r % 2 == 0 else ("worker", "raw")):
            got[which] = _run(_fresh(a.url, f"bench_tl_{which}", a.jobs), which == "worker")
            g = got[which]
            shares = ", ".join(f"{k} {v:.0%}" for k, v in g["shares"].items())
            print(f"round {r + 1} {which:6s} {g['rate']:8,.0f} jobs/s  claim {g['claim_ms']:.2f} "
                  f"ms, settle {g['settle_ms']:.2f} ms, claim to claim {g['gap_ms']:.2f} ms; "
                  f"{shares}", flush=True)
        ratios.append(got["worker"]["rate"] / got["raw"]["rate"])
    print(f"Worker / raw, consume batched 50: {statistics.median(ratios):.2f}x "
          f"(per round {', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
