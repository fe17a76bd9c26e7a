"""Orchestration: rounds, phases, checks and the command line of ``python -m bench``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import report
from bench.peers import REFERENCE, REGISTRY, available, open_adapter
from bench.worker import child

BENCH_DIR = Path(__file__).resolve().parent
MAIN_QUEUES = [
    "jobspool",
    "jobspool_nd",
    "sqlite_min",
    "sqlite_min_batch",
    "persistqueue",
    "litequeue_full",
    "litequeue",
    "dirq",
]
DEPTH_QUEUES = ["jobspool", "sqlite_min", "sqlite_min_batch", "naive"]
# Measured only when named with --only (variants of jobspool's flush strategy).
EXTRA_QUEUES = ["jobspool_fsync", "jobspool_syncfs"]
MAIN_METRICS = ["enqueue", "consume", "e2e_1", "e2e_2", "e2e_1_io", "e2e_2_io"]


@dataclass
class Config:
    rounds: int = 3
    n: int = 1000
    n_io: int = 500
    io_ms: float = 5.0
    batch: int = 50
    pad: int = 512
    physical_n: int = 400
    depths: list[int] = field(default_factory=lambda: [1_000, 10_000, 100_000])
    depth_jobs: int = 1000
    depth_rounds: int = 3
    depth_rounds_max: int = 3
    naive_budget_s: float = 10.0
    deadline_s: float = 300.0
    queues: list[str] = field(default_factory=lambda: list(MAIN_QUEUES))
    depth_queues: list[str] = field(default_factory=lambda: list(DEPTH_QUEUES))
    phases: list[str] = field(default_factory=lambda: ["physical", "main", "depth"])
    workdir: str = str(BENCH_DIR / ".work")
    out_dir: str = str(BENCH_DIR / "results")
    quick: bool = False


class Harness:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.ctx = mp.get_context("spawn")
        os.makedirs(cfg.workdir, exist_ok=True)
        # The work directory ignores itself, so a run never dirties the checkout.
        (Path(cfg.workdir) / ".gitignore").write_text("*\n")
        self.base = Path(cfg.workdir) / f"run-{os.getpid()}-{int(time.time())}"
        self.base.mkdir()
        self.records: list[dict[str, Any]] = []
        self.seq = 0

    # -- process groups -------------------------------------------------------
    def root(self, label: str) -> str:
        self.seq += 1
        return str(self.base / f"{self.seq:04d}-{label}")

    def group(self, specs: list[tuple[str, dict[str, Any]]]) -> tuple[float, list[Any]]:
        """Start ``specs`` as spawned children, release them together, collect their results."""
        ready, results = self.ctx.Queue(), self.ctx.Queue()
        start, producer_done = self.ctx.Event(), self.ctx.Event()
        if not any(role == "producer" for role, _ in specs):
            producer_done.set()
        procs = [
            self.ctx.Process(
                target=child, daemon=True, args=(role, params, ready, start, producer_done, results)
            )
            for role, params in specs
        ]
        for p in procs:
            p.start()
        try:
            for _ in procs:
                ready.get(timeout=180)
            # Flush what setup left dirty so that it is not charged to the measurement.
            os.sync()
            start.set()
            t0 = time.monotonic()
            out = [results.get(timeout=self.cfg.deadline_s + 180) for _ in procs]
        except queue_mod.Empty:
            out = [("?", None, "timed out waiting for a child")]
            t0 = time.monotonic()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        return t0, out

    def record(self, **rec: Any) -> dict[str, Any]:
        self.records.append(rec)
        tag = f"[r{rec.get('round')}] {rec['queue']:<15} {rec['metric']:<12}"
        if rec.get("error"):
            print(f"{tag} ERROR {rec['error'].strip().splitlines()[-1]}", flush=True)
        else:
            extra = "".join(
                f" {k}={rec[k]}" for k in ("dups", "missing", "extra", "lease_lost") if rec.get(k)
            )
            rate = rec.get("rate", rec.get("life_batch_jobs", 0))
            print(f"{tag} {rate:>10,.0f} jobs/s{extra}", flush=True)
        return rec

    @staticmethod
    def errors(out: list[Any]) -> str | None:
        errs = [f"{role}: {err}" for role, _, err in out if err]
        return "\n".join(errs) if errs else None

    @staticmethod
    def check(expected: range | list[int], consumers: list[dict[str, Any]]) -> dict[str, int]:
        """Compare what the consumers say they completed with what was enqueued."""
        seen = Counter(i for c in consumers for i in c["ids"])
        want = set(expected)
        return {
            "completed": sum(seen.values()),
            "dups": sum(v - 1 for v in seen.values() if v > 1),
            "missing": len(want - seen.keys()),
            "extra": len(seen.keys() - want),
            "lease_lost": sum(c["claimed"] - len(c["ids"]) for c in consumers if "claimed" in c),
            "timed_out": int(any(c.get("timed_out") for c in consumers)),
        }

    # -- phases ---------------------------------------------------------------
    def physical(self, rnd: int) -> None:
        cfg = self.cfg
        _, out = self.group(
            [("physical", {"root": self.root("physical"), "n": cfg.physical_n, "batch": cfg.batch})]
        )
        _, res, err = out[0]
        self.record(round=rnd, queue="physical", metric="physical", error=err, **(res or {}))

    def main_queue(self, rnd: int, q: str) -> None:
        cfg = self.cfg
        common = {"queue": q, "pad": cfg.pad, "batch": cfg.batch}
        ids = list(range(cfg.n))

        # enqueue, then drain the same queue with one consumer
        root = self.root(f"{q}-enq")
        _, out = self.group([("producer", {**common, "root": root, "ids": ids})])
        err = self.errors(out)
        res = out[0][1] or {}
        rate = cfg.n / (res["t_end"] - res["t_start"]) if not err else 0.0
        self.record(round=rnd, queue=q, metric="enqueue", rate=rate, error=err, rss_mb=res.get("rss_mb"))
        if not err:
            _, out = self.group(
                [("consumer", {**common, "root": root, "io_ms": 0, "deadline_s": cfg.deadline_s})]
            )
            err = self.errors(out)
            cons = [r for _, r, _ in out if r]
            rec: dict[str, Any] = {}
            if not err:
                rec = self.check(ids, cons)
                c = cons[0]
                rec["rate"] = len(set(c["ids"])) / max(c["t_end"] - c["t_start"], 1e-9)
                rec["rss_mb"] = c["rss_mb"]
            self.record(round=rnd, queue=q, metric="consume", error=err, **rec)
        self.cleanup(root)

        for metric, n, io, consumers in (
            ("e2e_1", cfg.n, 0.0, 1),
            ("e2e_2", cfg.n, 0.0, 2),
            ("e2e_1_io", cfg.n_io, cfg.io_ms, 1),
            ("e2e_2_io", cfg.n_io, cfg.io_ms, 2),
        ):
            if io == 0.0 and metric.endswith("_io"):
                continue
            root = self.root(f"{q}-{metric}")
            ids = list(range(n))
            specs = [("producer", {**common, "root": root, "ids": ids})]
            specs += [
                ("consumer", {**common, "root": root, "io_ms": io, "deadline_s": cfg.deadline_s})
            ] * consumers
            # Create the queue once before its processes open it concurrently.
            open_adapter(q, root, pad=cfg.pad).close()
            t0, out = self.group(specs)
            err = self.errors(out)
            rec = {}
            if not err:
                cons = [r for role, r, _ in out if role == "consumer"]
                rec = self.check(ids, cons)
                t_end = max(c["t_end"] for c in cons)
                rec["rate"] = len({i for c in cons for i in c["ids"]}) / max(t_end - t0, 1e-9)
                rec["rss_mb"] = max(c["rss_mb"] for c in cons)
            self.record(
                round=rnd, queue=q, metric=metric, error=err, io_ms=io, consumers=consumers, n=n, **rec
            )
            self.cleanup(root)

    def depth(self) -> None:
        cfg = self.cfg
        roots = {q: self.root(f"{q}-depth") for q in cfg.depth_queues}
        next_id = dict.fromkeys(cfg.depth_queues, 0)
        queued = dict.fromkeys(cfg.depth_queues, 0)
        completed: dict[str, Counter[int]] = {q: Counter() for q in cfg.depth_queues}
        broken: set[str] = set()
        for li, level in enumerate(cfg.depths):
            for q in cfg.depth_queues:
                if q in broken:
                    continue
                ids = list(range(next_id[q], next_id[q] + level - queued[q]))
                next_id[q] += len(ids)
                _, out = self.group([("prefill", {"queue": q, "root": roots[q], "pad": cfg.pad, "ids": ids})])
                err = self.errors(out)
                if err:
                    broken.add(q)
                queued[q] = level
                res = out[0][1] or {}
                self.record(
                    round=0,
                    queue=q,
                    metric=f"prefill_{level}",
                    error=err,
                    rate=len(ids) / max(res.get("t_end", 1) - res.get("t_start", 0), 1e-9),
                )
            rounds = cfg.depth_rounds_max if li == len(cfg.depths) - 1 else cfg.depth_rounds
            for rnd in range(rounds):
                for q in rotate(cfg.depth_queues, rnd):
                    if q in broken:
                        continue
                    ids = list(range(next_id[q], next_id[q] + cfg.depth_jobs))
                    next_id[q] += len(ids)
                    budget = cfg.naive_budget_s if q == "naive" else cfg.deadline_s
                    _, out = self.group(
                        [
                            (
                                "cycle",
                                {
                                    "queue": q,
                                    "root": roots[q],
                                    "pad": cfg.pad,
                                    "ids": ids,
                                    "batch": cfg.batch,
                                    "budget_s": budget,
                                },
                            )
                        ]
                    )
                    err = self.errors(out)
                    rec = {}
                    if not err:
                        c = out[0][1]
                        completed[q].update(c["ids"])
                        # Each cycle claims the oldest jobs, so it completes as many
                        # as it enqueued; a shortfall is a job the queue lost sight of.
                        dups = sum(v - 1 for v in completed[q].values() if v > 1)
                        rec = {
                            "rate": len(c["ids"]) / max(c["t_end"] - c["t_start"], 1e-9),
                            "completed": len(c["ids"]),
                            "enqueued": c["enqueued"],
                            "missing": c["enqueued"] - len(set(c["ids"])),
                            "dups": dups,
                            "capped": c["capped"],
                            "rss_mb": c["rss_mb"],
                            "rss_open_mb": c["rss_open_mb"],
                            "rss_import_mb": c["rss_import_mb"],
                            "t_enqueue": c["t_enqueue"],
                            "t_consume": c["t_consume"],
                            "t_warm": c.get("t_warm", 0.0),
                        }
                        # The backlog the queue keeps: what it did not complete stays queued.
                        queued[q] += c["enqueued"] - len(c["ids"])
                    else:
                        broken.add(q)
                    self.record(round=rnd, queue=q, metric=f"depth_{level}", error=err, depth=level, **rec)
        for r in roots.values():
            self.cleanup(r)

    def cleanup(self, root: str) -> None:
        shutil.rmtree(root, ignore_errors=True)

    def run(self) -> None:
        cfg = self.cfg
        if "physical" in cfg.phases or "main" in cfg.phases:
            for rnd in range(cfg.rounds):
                print(f"--- round {rnd + 1}/{cfg.rounds}", flush=True)
                if "physical" in cfg.phases:
                    self.physical(rnd)
                if "main" in cfg.phases:
                    for q in rotate(cfg.queues, rnd):
                        self.main_queue(rnd, q)
        if "depth" in cfg.phases and cfg.depth_queues:
            print("--- depth", flush=True)
            self.depth()
        shutil.rmtree(self.base, ignore_errors=True)


def rotate(items: list[str], k: int) -> list[str]:
    """``items`` starting at position ``k``: each round starts with a different queue."""
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, one round (smoke run)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these queues (repeat or comma-separate); {REFERENCE} is "
        "always added as the ratio reference. Names: " + ", ".join(REGISTRY),
    )
    p.add_argument(
        "--phases", default="physical,main,depth", help="comma-separated subset of physical,main,depth"
    )
    p.add_argument("--rounds", type=int)
    p.add_argument("--n", type=int, help="jobs per enqueue/consume/end-to-end run")
    p.add_argument("--n-io", type=int, help="jobs per end-to-end run with I/O-waiting handlers")
    p.add_argument("--io-ms", type=float, help="handler wait per job in the _io runs (0: skip)")
    p.add_argument("--batch", type=int, help="enqueue/claim/complete batch size (default 50)")
    p.add_argument("--pad", type=int, help="payload filler bytes per job")
    p.add_argument("--depths", help="comma-separated backlog sizes, e.g. 1000,10000,100000")
    p.add_argument("--depth-jobs", type=int, help="jobs per measurement at each depth")
    p.add_argument("--depth-rounds", type=int)
    p.add_argument("--depth-rounds-max", type=int, help="rounds at the largest depth")
    p.add_argument("--naive-budget", type=float, help="seconds per naive depth measurement")
    p.add_argument("--workdir", help="where queues live (must be on the disk under test)")
    p.add_argument("--out-dir", help="where results/<date>.json and .md are written")
    return p


def config_from(args: argparse.Namespace) -> Config:
    cfg = Config()
    if args.quick:
        cfg = Config(
            rounds=1,
            n=200,
            n_io=100,
            physical_n=100,
            depths=[100, 1000],
            depth_jobs=200,
            depth_rounds=1,
            depth_rounds_max=1,
            naive_budget_s=5.0,
            deadline_s=120.0,
            quick=True,
        )
    for name, attr in (
        ("rounds", "rounds"),
        ("n", "n"),
        ("n_io", "n_io"),
        ("io_ms", "io_ms"),
        ("batch", "batch"),
        ("pad", "pad"),
        ("depth_jobs", "depth_jobs"),
        ("depth_rounds", "depth_rounds"),
        ("depth_rounds_max", "depth_rounds_max"),
        ("naive_budget", "naive_budget_s"),
        ("workdir", "workdir"),
        ("out_dir", "out_dir"),
    ):
        if getattr(args, name) is not None:
            setattr(cfg, attr, getattr(args, name))
    if args.depths:
        cfg.depths = [int(x) for x in args.depths.split(",")]
    cfg.phases = [x for x in args.phases.split(",") if x]
    only = [x for arg in args.only for x in arg.split(",") if x]
    if only:
        unknown = set(only) - set(REGISTRY) - {"physical"}
        if unknown:
            raise SystemExit(f"unknown queue(s) {sorted(unknown)}; known: {', '.join(REGISTRY)}")
        wanted = set(only) | ({REFERENCE} if set(only) - {"physical"} else set())
        cfg.queues = [q for q in MAIN_QUEUES + EXTRA_QUEUES if q in wanted]
        cfg.depth_queues = [q for q in DEPTH_QUEUES + EXTRA_QUEUES if q in wanted]
        if "physical" not in only:
            cfg.phases = [p for p in cfg.phases if p != "physical"]
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from(args)
    skipped = {}
    for q in sorted(set(cfg.queues) | set(cfg.depth_queues)):
        why = available(q)
        if why:
            skipped[q] = why
            print(f"skipping {q}: {why}", file=sys.stderr)
    cfg.queues = [q for q in cfg.queues if q not in skipped]
    cfg.depth_queues = [q for q in cfg.depth_queues if q not in skipped]
    started = dt.datetime.now(dt.UTC)
    harness = Harness(cfg)
    t = time.monotonic()
    load_before = os.getloadavg()
    harness.run()
    meta = report.machine(cfg.workdir)
    meta.update(
        started=started.isoformat(timespec="seconds"),
        wall_s=round(time.monotonic() - t, 1),
        loadavg_before=load_before,
        loadavg_after=os.getloadavg(),
        skipped=skipped,
        argv=sys.argv[1:] if argv is None else argv,
    )
    summary = report.summarize(harness.records, cfg)
    doc = {"meta": meta, "config": asdict(cfg), "summary": summary, "records": harness.records}
    table = report.markdown(doc)
    os.makedirs(cfg.out_dir, exist_ok=True)
    stem = started.strftime("%Y-%m-%d-%H%M") + ("-quick" if cfg.quick else "")
    out = Path(cfg.out_dir) / stem
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(table)
    print()
    print(table)
    print(f"wrote {out}.json and {out}.md")
    return 0
