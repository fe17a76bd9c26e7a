"""Projection benchmark (issue 5): group commit vs per-job commits, and the cost of churn.

Run by hand, never as a timed test:

    python -m bench.bench_projection            # ~2-4 minutes on the 2-core reference machine
    python -m bench.bench_projection --quick    # smoke run

Part 1 — projected rows per second through `ProjectionStore.apply`, one
upsert per job, N jobs, with batch sizes 1, 10, 50 and 200 (one fenced
`merge_insert` per batch). Rounds are interleaved (every size once per
round) and each figure is the median; the ratio is against batch size 1 in
the same round. Target: >= 20x at batch sizes >= 50.

Part 2 — a table after 10,000 jobs (batches of 50, keys cycling over 2,000
ids so rows are updated as well as inserted), without and with the
maintenance beat running beside the writer: versions kept, fragments, write
throughput, and read latency (`get` of one key, `count`, a full `to_arrow`).
The beat runs with its defaults (a run every 100 commits or 60 s), except
`cleanup_older_than`, shortened to 5 s so that version cleanup can show
within the run; production keeps minutes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from jobspool.projection.handler import make_upsert
from jobspool.projection.lance import ProjectionStore

SIZES = (1, 10, 50, 200)
KEYSPACE = 2_000


def _jobs(start: int, n: int) -> list[Any]:
    return [
        make_upsert(
            f"job-{j}",
            "docs",
            {"id": f"doc-{j % KEYSPACE}", "title": f"title {j}", "words": j % 997},
            None,
            j + 1,
        )
        for j in range(start, start + n)
    ]


def _seed(store: ProjectionStore) -> None:
    result = store.apply(_jobs(0, 1))
    assert result.ok, result


def throughput(workdir: Path, batch: int, jobs: int, tag: str) -> float:
    """Rows/s projecting `jobs` one-upsert jobs in batches of `batch` into a fresh table."""
    path = workdir / f"tp-{tag}-{batch}"
    store = ProjectionStore(path)
    _seed(store)
    t0 = time.perf_counter()
    done = 0
    fence = 10
    while done < jobs:
        n = min(batch, jobs - done)
        # Built inside the timed loop: the worker does the same per batch.
        writes = _jobs(fence, n)
        result = store.apply(writes)
        if not result.ok:
            raise RuntimeError(f"apply failed: {result}")
        done += n
        fence += n
    elapsed = time.perf_counter() - t0
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return jobs / elapsed


def _median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def churn(workdir: Path, total: int, batch: int, with_beat: bool) -> dict[str, Any]:
    from jobspool.projection.maintenance import MaintenanceBeat

    path = workdir / f"churn-{'beat' if with_beat else 'none'}"
    store = ProjectionStore(path)
    beat = MaintenanceBeat(store, cleanup_older_than=timedelta(seconds=5)) if with_beat else None
    t0 = time.perf_counter()
    fence = 1
    try:
        while fence <= total:
            n = min(batch, total - fence + 1)
            result = store.apply(_jobs(fence, n))
            if not result.ok:
                raise RuntimeError(f"apply failed: {result}")
            fence += n
            if beat is not None:
                beat.note_commit("docs")
                beat.maybe_run()
        write_s = time.perf_counter() - t0
        if beat is not None and (beat.running or beat.maybe_run()):
            beat.wait_for_run(timeout=120)  # let a due or running run finish, not cancel it
    finally:
        if beat is not None:
            beat.close(timeout=120)
    outcomes: dict[str, int] = {}
    runs = beat.runs if beat is not None else 0
    if beat is not None and beat.last_report is not None:
        outcomes = beat.last_report.counts()
    proj = store.table("docs")
    raw = proj.raw
    assert raw is not None
    keys = [f"doc-{i}" for i in range(0, KEYSPACE, 41)]
    it = iter(keys * 10)
    out = {
        "jobs_per_s": total / write_s,
        "versions": len(raw.list_versions()),
        "fragments": raw.stats()["fragment_stats"]["num_fragments"],
        "get_ms": _median_ms(lambda: proj.get(next(it)), 40),
        "count_ms": _median_ms(proj.count, 10),
        "scan_ms": _median_ms(proj.to_arrow, 5),
        "rows": proj.count(),
        "beat_runs": runs,
        "last_run": outcomes,
    }
    store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    # Jobs per size: enough commits for a stable figure without waiting on
    # batch size 1 for minutes.
    jobs = {1: 60, 10: 300, 50: 1000, 200: 2000} if args.quick else {1: 150, 10: 1000, 50: 3000, 200: 6000}
    total = 2_000 if args.quick else 10_000
    workdir = Path(tempfile.mkdtemp(prefix="bench-projection-", dir=args.workdir))
    try:
        import lancedb

        print(f"lancedb {lancedb.__version__}; workdir {workdir}")
        rates: dict[int, list[float]] = {b: [] for b in SIZES}
        ratios: dict[int, list[float]] = {b: [] for b in SIZES}
        for r in range(rounds):
            order = SIZES[r % len(SIZES) :] + SIZES[: r % len(SIZES)]
            this = {b: throughput(workdir, b, jobs[b], f"r{r}") for b in order}
            for b in SIZES:
                rates[b].append(this[b])
                ratios[b].append(this[b] / this[1])
        print(f"\nPart 1: projected rows/s through ProjectionStore.apply (median of {rounds} round(s))")
        print(f"{'batch':>6} {'jobs':>6} {'rows/s':>10} {'vs batch 1':>11}  target")
        for b in SIZES:
            ratio = statistics.median(ratios[b])
            target = "" if b < 50 else ("met (>=20x)" if ratio >= 20 else "MISSED (<20x)")
            print(f"{b:>6} {jobs[b]:>6} {statistics.median(rates[b]):>10.0f} {ratio:>10.1f}x  {target}")

        print(f"\nPart 2: one table after {total:,} jobs in batches of 50 (keys over {KEYSPACE:,} ids)")
        rows = [
            ("no maintenance", churn(workdir, total, 50, False)),
            ("maintenance beat", churn(workdir, total, 50, True)),
        ]
        print(
            f"{'':<17} {'jobs/s':>7} {'versions':>9} {'fragments':>10} {'get ms':>7} "
            f"{'count ms':>9} {'scan ms':>8} {'rows':>6}  beat"
        )
        for name, m in rows:
            print(
                f"{name:<17} {m['jobs_per_s']:>7.0f} {m['versions']:>9} {m['fragments']:>10} "
                f"{m['get_ms']:>7.2f} {m['count_ms']:>9.2f} {m['scan_ms']:>8.2f} "
                f"{m['rows']:>6}  {m['beat_runs']} runs, last {m['last_run']}"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
