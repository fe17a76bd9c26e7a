"""jobspool's PostgreSQL store against the minimal fenced queue and pgqueuer (issue 16's targets).

    .venv/bin/python bench/pg.py [--jobs 5000] [--rounds 3] [--big] [--url postgresql://...]

Starts its own throwaway PostgreSQL (tools/pg-tmp.sh; fsync and synchronous_commit on)
unless `--url` names a server, where it (re)creates databases named bench_*. One database
per queue, same server, same run. Rounds are interleaved (every queue once per round, the
first one rotating); before each timed measurement the database gets VACUUM ANALYZE and the
server checkpointed (untimed), so leftovers of one measurement are not charged to the
next; each measurement runs in a fresh child process, warmed before its clock starts
(10 jobs for an enqueue; for a consume, a first Worker run on 10 jobs of another kind, or
two empty claims for the claim loops; pgqueuer's imports and connection come before its
clock too): imports, connections and prepared statements are a process's one-time costs. Every figure is the median of the
rounds and every ratio the median of per-round ratios: the machine is shared and
absolute numbers drift, only the ratios are headlines.

Measured per round (`--jobs` N jobs each, payload {"i": n, "pad": 512 bytes}):
- minimal fenced queue (bench/pg_peers.py, as issue 16 describes it): enqueue one job
  per call (INSERT, autocommit); consume batched (claim 50 / complete 50, no-op handler);
  and, for information, enqueue one per call with a NOTIFY in the same statement.
- jobspool (`Spool("postgresql://...")`): enqueue one per call (`spool.enqueue`); consume
  batched through `Worker(spool, handlers={...no-op}, batch_size=50).run_until_idle()`;
  and raw `claim(limit=50)` + `complete_many`, fed by `enqueue_many` batches of 50; and
  the INSERT a one-job enqueue sends, sent by bare psycopg (`statement_enqueue`): the
  floor jobspool's schema and NOTIFY set for its enqueue, without its Python.
- pgqueuer (if importable): enqueue one per call (`Queries.enqueue`); consume with one
  QueueManager, no-op async entrypoint, `run(batch_size=B, mode=drain)`, B = its default
  (10) and each of `--pgq-batches`; "best" is the batch size with the best median.
- idle pickup of jobspool's worker (LISTEN/NOTIFY): a worker idles in `run_forever` in a
  child process; the producer enqueues one job at a time after a random 10-50 ms gap,
  carrying its send time; the handler records when it starts. p50/p95 over all rounds,
  from before the enqueue call and from its return. The same for the minimal queue
  (INSERT + NOTIFY; a LISTEN connection, claim when notified) as the reference.
With `--big`: dead tuples (pg_stat_user_tables) of jobspool's tables sampled during a
100k-job run (a `run_forever` worker draining while a producer enqueues one per call).
Results: printed, and written to bench/results/pg-<date>-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing as mp
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: `python bench/pg.py`
    sys.path.insert(0, str(REPO))

from bench import pg_jobspool as js  # noqa: E402
from bench import pg_peers as peers  # noqa: E402
from bench import pg_server  # noqa: E402
from bench.pg_report import render  # noqa: E402

CTX = mp.get_context("spawn")
DBS = {"minimal": "bench_minimal", "jobspool": "bench_jobspool", "pgqueuer": "bench_pgqueuer",
       "pickup_jobspool": "bench_pickup_jobspool", "pickup_minimal": "bench_pickup_minimal",
       "big": "bench_big"}
PGQ_DEFAULT = 10  # QueueManager.run(batch_size=10)


def _child(fn: Callable[..., Any], *args: Any, timeout: float = 900) -> Any:
    """Run fn(*args) in a fresh spawned process and return its result."""
    with ProcessPoolExecutor(1, mp_context=CTX) as ex:
        return ex.submit(fn, *args).result(timeout=timeout)


def _sql(url: str, *statements: str) -> list[Any]:
    import psycopg

    out = []
    with psycopg.connect(url, autocommit=True) as conn:
        for s in statements:
            cur = conn.execute(s)
            out.append(cur.fetchall() if cur.description else None)
    return out


class Bench:
    """One run: the server, its databases, the raw samples."""

    def __init__(self, args: argparse.Namespace, base_url: str) -> None:
        self.a = args
        self.base = base_url
        self.raw: dict[str, list[Any]] = {}
        self.notes: list[str] = []

    def url(self, which: str) -> str:
        return self.base.rsplit("/", 1)[0] + "/" + DBS[which]

    def fresh_db(self, which: str) -> str:
        _sql(self.base, f"DROP DATABASE IF EXISTS {DBS[which]} WITH (FORCE)",
             f"CREATE DATABASE {DBS[which]}")
        if self.a.statements:
            _sql(self.url(which), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return self.url(which)

    def statements(self, which: str, top: int = 8) -> list[list[Any]]:
        """The statements that took the server's time in one database (all rounds, untimed
        fills included): calls, total ms, mean ms, rows, the statement's start."""
        rows = _sql(self.url(which), f"""
            SELECT calls, round(total_exec_time::numeric, 1)::float8,
                   round(mean_exec_time::numeric, 3)::float8, rows,
                   left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
            FROM pg_stat_statements
            WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND query !~* '^(VACUUM|CHECKPOINT|CREATE|DROP|SELECT pg_stat)'
            ORDER BY total_exec_time DESC LIMIT {top}""")[0]
        return [list(r) for r in rows]

    def settle(self, which: str) -> None:
        """Untimed: vacuum the queue's database and checkpoint, so no measurement pays for
        the previous one's dead rows or dirty buffers."""
        if not self.a.no_settle:
            # ANALYZE too: a queue in service has column statistics (autovacuum), and
            # without them a planner may choose a depth-dependent claim plan.
            _sql(self.url(which), "VACUUM" if self.a.no_analyze else "VACUUM ANALYZE", "CHECKPOINT")

    def add(self, key: str, value: Any) -> None:
        self.raw.setdefault(key, []).append(value)

    def measure(self, key: str | None, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) in a child; a failure is a note (one line), not the end of the run."""
        try:
            res = _child(fn, *args)
        except Exception as e:
            last = (str(e).strip().splitlines() or [""])[-1]
            msg = f"{key or fn.__name__}: failed: {type(e).__name__}: {last}"
            print(f"bench/pg.py: {msg}", file=sys.stderr)
            self.notes.append(msg)
            if key is not None:
                self.add(key, None)  # keeps the rounds of every key aligned for the ratios
            return None
        if key is None:
            return res
        if isinstance(res, dict):
            self.consumed(key, res)
        else:
            self.add(key, res)
        return res

    def consumed(self, key: str, res: dict[str, Any]) -> None:
        self.add(key, res["rate"])
        if res["done"] != res["expected"] or res.get("lost") or res.get("left"):
            self.notes.append(f"{key}: completed {res['done']} of {res['expected']} "
                              f"(lost {res.get('lost', 0)}, left {res.get('left', 0)})")

    # ---------------------------------------------------------------- per queue

    def minimal(self) -> None:
        u, n, b = self.url("minimal"), self.a.jobs, self.a.batch
        self.settle("minimal")
        self.measure("minimal.enqueue", peers.minimal_enqueue, u, n, self.a.pad)
        self.settle("minimal")
        self.measure("minimal.consume", peers.minimal_consume, u, n, b)
        self.settle("minimal")
        self.measure("minimal.enqueue_notify", peers.minimal_enqueue, u, n, self.a.pad, True)
        self.measure(None, peers.minimal_consume, u, n, b)  # drain, untimed

    def jobspool(self) -> None:
        u, n, b = self.url("jobspool"), self.a.jobs, self.a.batch
        self.settle("jobspool")
        self.measure("jobspool.enqueue", js.enqueue, u, n, self.a.pad)
        self.settle("jobspool")
        self.measure("jobspool.worker", js.worker_consume, u, n, b)
        self.settle("jobspool")
        self.measure("jobspool.statement_enqueue", js.statement_enqueue, u, n, self.a.pad)
        self.measure(None, js.raw_consume, u, n, b)  # drain, untimed
        self.settle("jobspool")
        self.measure("jobspool.enqueue_many", js.enqueue_many, u, n, self.a.pad, b)
        self.settle("jobspool")
        self.measure("jobspool.raw", js.raw_consume, u, n, b)

    def pgqueuer(self) -> None:
        u, n = self.url("pgqueuer"), self.a.jobs
        self.settle("pgqueuer")
        self.measure("pgqueuer.enqueue", peers.pgqueuer_enqueue, u, n, self.a.pad)
        for i, size in enumerate(self.pgq_batches()):
            if i:  # the first drain eats the jobs enqueued one per call above
                self.measure(None, peers.pgqueuer_enqueue, u, n, self.a.pad, False)
            self.settle("pgqueuer")
            self.measure(f"pgqueuer.consume.{size}", peers.pgqueuer_consume, u, n, size)

    def pgq_batches(self) -> list[int]:
        extra = [int(x) for x in self.a.pgq_batches.split(",") if x.strip()]
        return [PGQ_DEFAULT, *[x for x in extra if x != PGQ_DEFAULT]]

    def pickup(self, which: str, seed: int) -> None:
        """Idle pickup: a worker child idles; this process enqueues one job at a time."""
        worker, produce = {"jobspool": (js.pickup_worker, js.pickup_produce),
                           "minimal": (peers.minimal_pickup_worker,
                                       peers.minimal_pickup_produce)}[which]
        u = self.url(f"pickup_{which}")
        samples, ready, stop = CTX.Queue(), CTX.Event(), CTX.Event()
        p = CTX.Process(target=worker, args=(u, samples, ready, stop, self.a.batch))
        p.start()
        try:
            if not ready.wait(60):
                raise RuntimeError(f"the {which} pickup worker did not start")
            produce(u, 3, (0.05, 0.05), samples, seed)  # warm: connections, LISTEN, prepares
            self.add(f"pickup.{which}", produce(u, self.a.pickup, (0.01, 0.05), samples, seed))
        finally:
            stop.set()
            p.join(30)
            if p.is_alive():
                p.kill()


def _big(b: Bench) -> dict[str, Any]:
    """Dead tuples of jobspool's tables over a `--big-jobs` run, sampled as it goes."""
    import threading

    from jobspool import Spool

    u = b.fresh_db("big")
    _child(js.setup, u)
    n = b.a.big_jobs
    done, ready, stop = CTX.Value("q", 0), CTX.Event(), CTX.Event()
    p = CTX.Process(target=js.churn_worker, args=(u, done, ready, stop, b.a.batch))
    p.start()
    ready.wait(60)
    series: list[dict[str, Any]] = []
    produced = [0]
    t0 = time.perf_counter()
    q = ("SELECT relname, n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,"
         " autovacuum_count, vacuum_count, pg_total_relation_size(relid) FROM pg_stat_user_tables"
         " ORDER BY relname")

    def sample(tag: str) -> None:
        rows = _sql(u, q)[0]
        series.append({"t": round(time.perf_counter() - t0, 1), "tag": tag, "enqueued": produced[0],
                       "completed": done.value,
                       "tables": {r[0]: dict(zip(("live", "dead", "ins", "upd", "hot_upd", "del",
                                                  "autovacuums", "vacuums", "bytes"), r[1:],
                                                 strict=True)) for r in rows}})

    halt = threading.Event()

    def sampler() -> None:
        while not halt.wait(b.a.sample_seconds):
            sample("running")
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    with Spool(u) as spool:
        for i in range(n):
            spool.enqueue("bench", peers.payload(i, b.a.pad))
            produced[0] = i + 1
    deadline = time.monotonic() + 600
    while done.value < n and time.monotonic() < deadline and p.is_alive():
        time.sleep(0.2)
    elapsed = time.perf_counter() - t0
    halt.set()
    th.join()
    stop.set()
    p.join(60)
    time.sleep(1.5)  # a backend's pending statistics are flushed at most once a second
    sample("end")
    return {"jobs": n, "completed": done.value, "seconds": round(elapsed, 1), "series": series,
            "autovacuum_naptime": _sql(u, "SHOW autovacuum_naptime")[0][0][0]}


def _versions(base: str) -> dict[str, str]:
    import psycopg

    import jobspool

    out = {"postgresql": _sql(base, "SHOW server_version")[0][0][0], "psycopg": psycopg.__version__,
           "jobspool": getattr(jobspool, "__version__", "?"), "python": sys.version.split()[0]}
    with contextlib.suppress(OSError):
        out["commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
        # What ran is the working tree: say so when jobspool/ differs from the commit.
        if subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "jobspool"],
                          capture_output=True, text=True).stdout.strip():
            out["commit"] += " + uncommitted changes in jobspool/"
    if peers.pgqueuer_available() is None:
        from importlib.metadata import version

        out["pgqueuer"] = f"{version('pgqueuer')} ({peers.pgqueuer_driver()})"
    return out


def _store_available() -> str | None:
    try:
        from jobspool.pg import spool  # noqa: F401
    except ImportError as e:
        return f"jobspool's PostgreSQL store is not importable ({e}): its rows are skipped"
    return None


def run(args: argparse.Namespace, base: str) -> dict[str, Any]:
    b = Bench(args, base)
    queues = [q for q in ("minimal", "jobspool", "pgqueuer") if q in args.only.split(",")]
    for q, why in (("pgqueuer", peers.pgqueuer_available()), ("jobspool", _store_available())):
        if why and q in queues:
            print(f"bench/pg.py: {why}", file=sys.stderr)
            b.notes.append(why)
            queues.remove(q)
    setups = {"minimal": peers.minimal_setup, "jobspool": js.setup, "pgqueuer": peers.pgqueuer_setup}
    for q in list(queues):
        if b.measure(None, setups[q], b.fresh_db(q)) is None and b.notes and b.notes[-1].startswith(
                setups[q].__name__):
            queues.remove(q)
    pickers = [q for q in ("jobspool", "minimal") if q in queues and args.pickup]
    for q in pickers:
        b.measure(None, setups[q], b.fresh_db(f"pickup_{q}"))
    for r in range(args.rounds):
        order = queues[r % len(queues):] + queues[:r % len(queues)] if queues else []
        t = time.perf_counter()
        for q in order:
            getattr(b, q)()
        for q in pickers[r % len(pickers):] + pickers[:r % len(pickers)] if pickers else []:
            try:
                b.pickup(q, seed=r)
            except Exception as e:
                b.notes.append(f"pickup {q} round {r + 1}: failed: {type(e).__name__}: {e}")
                print(f"bench/pg.py: {b.notes[-1]}", file=sys.stderr)
                b.add(f"pickup.{q}", None)
        print(f"round {r + 1}/{args.rounds} done in {time.perf_counter() - t:.0f} s "
              f"({', '.join(order)})", file=sys.stderr)
    result: dict[str, Any] = {"config": vars(args), "raw": b.raw, "notes": b.notes,
                              "pgq_batches": b.pgq_batches() if "pgqueuer" in queues else []}
    if args.statements:
        result["statements"] = {q: b.statements(q) for q in queues + [f"pickup_{p}" for p in pickers]}
    if args.big and "jobspool" in queues:
        print(f"big run: {args.big_jobs} jobs ...", file=sys.stderr)
        result["big"] = _big(b)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/pg.py", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=5000, help="jobs per measurement (default 5000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--batch", type=int, default=50, help="claim/complete batch (default 50)")
    p.add_argument("--pad", type=int, default=512, help="payload filler bytes (default 512)")
    p.add_argument("--pgq-batches", default="25,50,100,200,500",
                   help="pgqueuer batch sizes tried besides its default 10")
    p.add_argument("--pickup", type=int, default=100, help="pickup samples per round (0: none)")
    p.add_argument("--only", default="minimal,jobspool,pgqueuer", help="queues to measure")
    p.add_argument("--big", action="store_true", help="also the 100k-job dead-tuple run")
    p.add_argument("--big-jobs", type=int, default=100_000)
    p.add_argument("--sample-seconds", type=float, default=5.0, help="dead-tuple sampling period")
    p.add_argument("--url", help="an existing server (its bench_* databases are recreated)")
    p.add_argument("--server-opts", default="", help="extra -c flags for the throwaway server")
    p.add_argument("--no-settle", action="store_true", help="skip VACUUM+CHECKPOINT between runs")
    p.add_argument("--no-analyze", action="store_true",
                   help="VACUUM without ANALYZE between runs (tables without column statistics)")
    p.add_argument("--statements", action="store_true",
                   help="load pg_stat_statements and report where each database's server time went")
    p.add_argument("--out", help="results path without suffix (default bench/results/pg-<time>)")
    args = p.parse_args(argv)
    for name in ("jobs", "rounds", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.statements and args.url:
        # Found out only after every round had run: the extension needs a server started
        # with it preloaded, which only the bench's own server is.
        p.error("--statements needs the bench's own server (pg_stat_statements must be "
                "preloaded): leave out --url")
    opts = args.server_opts
    if args.statements:
        opts += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"
    server = None if args.url else pg_server.start(opts)
    base = args.url or (server.url if server else "")
    try:
        versions = _versions(base)
        started = dt.datetime.now(dt.UTC)
        result = run(args, base)
        result.update(versions=versions, started=started.isoformat(timespec="seconds"),
                      command="bench/pg.py " + " ".join(sys.argv[1:] if argv is None else argv))
    finally:
        if server:
            pg_server.stop(server)
    text = render(result)
    print(text)
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"pg-{started:%Y-%m-%d-%H%M}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    out.with_suffix(".md").write_text(text + "\n")
    print(f"written: {out}.json, {out}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
