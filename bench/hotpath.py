"""The hot path against its floor (issue 14): one job at a time and batched, each against
SQLite in the same mode, in the same run; flushes and new inodes counted with strace.

    python -m bench.hotpath [--n 400] [--rounds 5] [--batch 50] [--no-strace]

Rounds are interleaved (jobspool, then SQLite, order rotating); every ratio is the
median of per-round ratios to the SQLite figure of the same mode and round, so a
noisy neighbour slows both sides of a ratio alike. Like is compared with like:

- `one`: enqueue one job per call; claim(limit=1) + complete per job. SQLite
  `synchronous=FULL`, one commit per call (bench/peers/sqlite_min.py).
- `batch`: enqueue_many / claim / complete_many of `--batch` jobs. SQLite: one
  commit per batch.
- `4 producers`: four processes enqueueing one job per call at once, aggregate
  jobs/s, against one producer, for both queues.
- `idle pickup`: a `jobspool worker`-like Worker idling on an empty spool; a
  producer enqueues one job at a time at random gaps; the handler records when
  it starts. p50/p95 of the delay from the enqueue call, and from its return
  (what the worker controls: the enqueue's own flushes excluded), and the idle
  worker's CPU over 5 s.
- `durable=False`: claim + complete one at a time, jobspool_nd vs dirq (if the
  `dirq` package is installed: pip install dirq==1.8).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PAD = 512


def _jobspool(root: str, durable: bool = True) -> Any:
    from bench.peers.jobspool_adapter import JobspoolAdapter

    return JobspoolAdapter(root, durable=durable, pad=PAD)


def _sqlite(root: str) -> Any:
    from bench.peers.sqlite_min import SqliteMinAdapter

    return SqliteMinAdapter(root, pad=PAD)


def _dirq(root: str) -> Any:
    from bench.peers.dirq_adapter import DirqAdapter

    return DirqAdapter(root, pad=PAD)


MAKERS = {"jobspool": _jobspool, "sqlite": _sqlite, "jobspool_nd": lambda r: _jobspool(r, False),
          "dirq": _dirq}


def _run(kind: str, root: str, n: int, batch: int) -> tuple[float, float]:
    """(enqueue jobs/s, claim+complete jobs/s) for `n` jobs in batches of `batch`."""
    q = MAKERS[kind](root)
    try:
        os.sync()
        t = time.perf_counter()
        for k in range(0, n, batch):
            q.enqueue(list(range(k, min(n, k + batch))))
        enq = n / (time.perf_counter() - t)
        os.sync()
        done = 0
        t = time.perf_counter()
        while done < n:
            got = q.claim(batch)
            if not got:
                break
            done += len(q.complete(got))
        con = done / (time.perf_counter() - t)
        assert done == n, f"{kind}: consumed {done} of {n}"
        return enq, con
    finally:
        q.close()


def _child_run(args: tuple[str, str, int, int], out: Any) -> None:
    out.put(_run(*args))


def _isolated(kind: str, root: str, n: int, batch: int) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_child_run, args=((kind, root, n, batch), out))
    p.start()
    res = out.get(timeout=600)
    p.join()
    return res  # type: ignore[no-any-return]


def _producer(kind: str, root: str, start: int, n: int, go: Any, out: Any) -> None:
    q = MAKERS[kind](root)
    go.wait()
    t = time.perf_counter()
    for i in range(start, start + n):
        q.enqueue([i])
    out.put((t, time.perf_counter()))
    q.close()


def _producers(kind: str, root: str, n: int, procs: int) -> float:
    """Aggregate enqueue jobs/s of `procs` processes enqueueing one job per call at once."""
    ctx = mp.get_context("spawn")
    MAKERS[kind](root).close()  # create the queue before the race
    go, out = ctx.Event(), ctx.Queue()
    per = n // procs
    ps = [ctx.Process(target=_producer, args=(kind, root, i * per, per, go, out))
          for i in range(procs)]
    for p in ps:
        p.start()
    time.sleep(1.0)  # every child has opened its queue (imports done)
    os.sync()
    go.set()
    spans = [out.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    return per * procs / (max(e for _, e in spans) - min(s for s, _ in spans))


def _strace_counts(n: int) -> dict[str, float] | None:
    """Flushes and new inodes per job life (enqueue + claim + complete, one at a time)."""
    if shutil.which("strace") is None:
        return None
    work = tempfile.mkdtemp(prefix="hotpath-strace-")
    script = (
        "import sys; from jobspool import Spool\n"
        "s = Spool(sys.argv[1], lease_seconds=600, keep_terminal=20)\n"
        "for i in range(int(sys.argv[2])):\n"
        "    s.enqueue('bench', {'i': i}); (l,) = s.claim(limit=1); s.complete(l)\n")
    # Warm-up outside the trace: the steady state is what is counted.
    subprocess.run([sys.executable, "-c", script, f"{work}/q", "300"], check=True, cwd=REPO)
    log = f"{work}/trace"
    subprocess.run(["strace", "-f", "-qq", "-o", log, "-e",
                    "trace=fsync,fdatasync,syncfs,openat,creat,mkdir",
                    sys.executable, "-c", script, f"{work}/q", str(n)], check=True, cwd=REPO)
    text = Path(log).read_text()
    flushes = len(re.findall(r"\b(?:fsync|fdatasync|syncfs)\(\d+\)\s+=\s+0", text))
    # A new inode: an O_CREAT open of a file in the spool that succeeded with O_EXCL, or
    # any O_CREAT open of a path under tmp/ or a state directory.
    spool = f"{work}/q/"
    created = 0
    for line in text.splitlines():
        if "O_CREAT" in line and spool in line and not line.rstrip().endswith(")") \
                and "= -1" not in line and ".lock" not in line and "/live/" not in line:
            created += 1
    # The process start-up (imports, the spool's first open) is paid once, not per job.
    base = subprocess.run(["strace", "-f", "-qq", "-o", log + ".0", "-e",
                           "trace=fsync,fdatasync,syncfs,openat,creat,mkdir",
                           sys.executable, "-c", script, f"{work}/q", "0"], cwd=REPO)
    text0 = Path(log + ".0").read_text() if base.returncode == 0 else ""
    flushes0 = len(re.findall(r"\b(?:fsync|fdatasync|syncfs)\(\d+\)\s+=\s+0", text0))
    shutil.rmtree(work, ignore_errors=True)
    return {"flushes_per_life": (flushes - flushes0) / n, "new_inodes_per_life": created / n}


def _idle_pickup(samples: int) -> dict[str, float]:
    work = tempfile.mkdtemp(prefix="hotpath-idle-")
    root = f"{work}/q"
    from jobspool import Spool

    Spool(root).close()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    lat = Path(work) / "lat"
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobspool", "--root", root, "worker", "--app",
         "bench.hotpath_app:app", "--concurrency", "1"],
        cwd=REPO, env=dict(env, HOTPATH_LAT=str(lat)))
    try:
        s = Spool(root)
        s.enqueue("ping")  # wait for the worker to be up
        while not lat.exists() or not lat.read_text().strip():
            time.sleep(0.05)
        time.sleep(1.0)
        lat.write_text("")
        cpu0 = _cpu(worker.pid)
        time.sleep(5.0)
        idle_cpu = (_cpu(worker.pid) - cpu0) / 5.0
        import random

        sent: dict[str, tuple[float, float]] = {}
        for _ in range(samples):
            time.sleep(random.uniform(0.05, 0.15))
            called = time.time()
            job = s.enqueue("ping")
            sent[job.id] = (called, time.time())
        deadline = time.time() + 30
        while len(lat.read_text().splitlines()) < samples and time.time() < deadline:
            time.sleep(0.05)
        started = dict(line.split() for line in lat.read_text().splitlines() if line)
        s.close()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    call = sorted((float(started[i]) - c) * 1000 for i, (c, _) in sent.items() if i in started)
    ret = sorted((float(started[i]) - r) * 1000 for i, (_, r) in sent.items() if i in started)

    def p95(vals: list[float]) -> float:
        return vals[min(len(vals) - 1, int(len(vals) * 0.95))]

    return {"p50_ms": statistics.median(call), "p95_ms": p95(call),
            "p50_ret_ms": statistics.median(ret), "p95_ret_ms": p95(ret),
            "samples": len(call), "idle_cpu_pct": idle_cpu * 100}


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=400, help="jobs per one-at-a-time run")
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-strace", action="store_true")
    p.add_argument("--pickup-samples", type=int, default=60)
    p.add_argument("--skip", default="", help="comma list of: one,batch,producers,idle,nd")
    a = p.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="hotpath-", dir=str(REPO / "bench")))
    rows: list[tuple[str, str, str]] = []
    try:
        modes = [m for m in (("one", 1, a.n), ("batch", a.batch, a.n * 10))
                 if m[0] not in skip]
        for mode, b, n in modes:
            enq: dict[str, list[float]] = {"jobspool": [], "sqlite": []}
            con: dict[str, list[float]] = {"jobspool": [], "sqlite": []}
            for rnd in range(a.rounds):
                order = ["jobspool", "sqlite"][:: 1 if rnd % 2 == 0 else -1]
                for kind in order:
                    e, c = _isolated(kind, str(work / f"{mode}-{kind}-{rnd}"), n, b)
                    enq[kind].append(e)
                    con[kind].append(c)
            for name, d in (("enqueue", enq), ("claim+complete", con)):
                ratio = statistics.median(j / s for j, s in zip(d["jobspool"], d["sqlite"]))
                rows.append((f"{mode}: {name}",
                             f"{statistics.median(d['jobspool']):,.0f} vs "
                             f"{statistics.median(d['sqlite']):,.0f} jobs/s", f"{ratio:.2f}x"))
            print(*rows[-2:], sep="\n", flush=True)
        if "producers" not in skip:
            agg: dict[str, list[float]] = {k: [] for k in ("j1", "j4", "s1", "s4")}
            for rnd in range(a.rounds):
                for key, kind, procs in (("j1", "jobspool", 1), ("s1", "sqlite", 1),
                                         ("j4", "jobspool", 4), ("s4", "sqlite", 4)):
                    agg[key].append(_producers(kind, str(work / f"p-{key}-{rnd}"), a.n, procs))
            med = {k: statistics.median(v) for k, v in agg.items()}
            rows.append(("4 producers ÷ 1 (jobspool)",
                         f"{med['j4']:,.0f} vs {med['j1']:,.0f} jobs/s",
                         f"{statistics.median(x / y for x, y in zip(agg['j4'], agg['j1'])):.2f}x"))
            rows.append(("4 producers, jobspool vs SQLite",
                         f"{med['j4']:,.0f} vs {med['s4']:,.0f} jobs/s",
                         f"{statistics.median(x / y for x, y in zip(agg['j4'], agg['s4'])):.2f}x"))
            print(*rows[-2:], sep="\n", flush=True)
        if "nd" not in skip:
            try:
                _dirq(str(work / "probe")).close()
                have_dirq = True
            except ImportError:
                have_dirq = False
            if have_dirq:
                r: dict[str, list[float]] = {"jobspool_nd": [], "dirq": []}
                for rnd in range(a.rounds):
                    for kind in r:
                        r[kind].append(_isolated(kind, str(work / f"nd-{kind}-{rnd}"),
                                                 a.n * 5, 1)[1])
                rows.append(("durable=False claim+complete, one at a time, vs dirq",
                             f"{statistics.median(r['jobspool_nd']):,.0f} vs "
                             f"{statistics.median(r['dirq']):,.0f} jobs/s",
                             f"{statistics.median(x / y for x, y in zip(r['jobspool_nd'], r['dirq'])):.2f}x"))
                print(rows[-1], flush=True)
        if not a.no_strace:
            counts = _strace_counts(200)
            if counts:
                rows.append(("flushes per job life (one at a time)",
                             f"{counts['flushes_per_life']:.2f}", ""))
                rows.append(("new inodes per job life (steady state)",
                             f"{counts['new_inodes_per_life']:.2f}", ""))
                print(*rows[-2:], sep="\n", flush=True)
        if "idle" not in skip:
            idle = _idle_pickup(a.pickup_samples)
            rows.append(("idle pickup p50 / p95, from the enqueue call",
                         f"{idle['p50_ms']:.1f} / {idle['p95_ms']:.1f} ms", ""))
            rows.append(("idle pickup p50 / p95, from the enqueue's return",
                         f"{idle['p50_ret_ms']:.1f} / {idle['p95_ret_ms']:.1f} ms "
                         f"({idle['samples']:.0f} samples)", ""))
            rows.append(("idle worker CPU", f"{idle['idle_cpu_pct']:.2f}% of a core", ""))
            print(*rows[-2:], sep="\n", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| measure | figures | ratio |\n|---|---|---:|")
    for r3 in rows:
        print(f"| {r3[0]} | {r3[1]} | {r3[2]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
