"""A/B of the claim's `exclude` on PostgreSQL, interleaved in one run.

    python -m bench.pg_exclude [--url URL] [--jobs 10000] [--rounds 5] [--excluded 150]

A Worker claims with `exclude` = the jobs it holds (two to four batches of 50). Written
as `NOT (id = ANY(array))`, each row the claim's index scan met was compared with every
excluded id; as `id NOT IN (SELECT unnest(array))`, the server hashes the array once
(a hashed SubPlan). Each round drains `--jobs` jobs with `claim(limit=50)` +
`complete_many` (batched) three ways, in rotating order: no exclude, the old form, the
new form, both with `--excluded` ids that match no job. Prints the median of per-round
ratios to "no exclude" (the shared machine's load moves all three alike within a round).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from typing import Any

from bench import pg_server

OLD = "NOT (id = ANY(%(exclude)b::text[]))"
NEW = "id NOT IN (SELECT unnest(%(exclude)b::text[]))"


def drain(spool: Any, exclude: frozenset[str]) -> float:
    """Jobs/s of claim(limit=50) + complete_many until the queue is empty."""
    done = 0
    t = time.perf_counter()
    while True:
        leases = spool.claim(kinds="bench", limit=50, exclude=exclude)
        if not leases:
            break
        done += len(spool.complete_many([(lease, None) for lease in leases]))
    return done / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/pg_exclude.py", description=__doc__.split("\n")[0])
    p.add_argument("--url", help="an existing server (a database is created on it)")
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--excluded", type=int, default=150)
    a = p.parse_args(argv)
    import psycopg

    from jobspool import Spool
    from jobspool.pg import sql

    server = None if a.url else pg_server.start()
    base = a.url or (server.url if server else "")
    try:
        db = f"bench_exclude_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(base, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {db}")
        new_claim_sql = sql.claim_sql
        if NEW not in new_claim_sql(["bench"], 50):
            print("bench/pg_exclude.py: this checkout's claim has no NOT IN form to compare",
                  file=sys.stderr)
            return 1

        def old_claim_sql(*args: Any, **kw: Any) -> str:
            return str(new_claim_sql(*args, **kw)).replace(NEW, OLD)

        excluded = frozenset(uuid.uuid4().hex for _ in range(a.excluded))
        variants = {"none": (new_claim_sql, frozenset[str]()),
                    "any(array)": (old_claim_sql, excluded),
                    "not in (hashed)": (new_claim_sql, excluded)}
        rates: dict[str, list[float]] = {k: [] for k in variants}
        with Spool(base.rsplit("/", 1)[0] + "/" + db) as spool:
            pad = "x" * 512
            names = list(variants)
            for r in range(a.rounds):
                for name in names[r % 3:] + names[:r % 3]:
                    for k in range(0, a.jobs, 500):
                        spool.enqueue_many("bench", [{"i": i, "pad": pad}
                                                     for i in range(k, min(a.jobs, k + 500))])
                    form, exclude = variants[name]
                    sql.claim_sql = form
                    try:
                        rates[name].append(drain(spool, exclude))
                    finally:
                        sql.claim_sql = new_claim_sql
        print(f"claim(limit=50) + complete_many, batched, {a.jobs} jobs, {a.rounds} rounds, "
              f"{a.excluded} excluded ids")
        for name, got in rates.items():
            ratio = statistics.median(x / y for x, y in zip(got, rates["none"], strict=True))
            print(f"  {name:16} {statistics.median(got):8,.0f} jobs/s  {ratio:.2f}x no exclude")
        return 0
    finally:
        if server:
            pg_server.stop(server)


if __name__ == "__main__":
    raise SystemExit(main())
