"""`jobspool demo`: a realistic batch through two worker processes into an embedded LanceDB table.

It enqueues a few thousand small documents, runs `jobspool run-until-idle`
twice in parallel as separate OS processes over one spool, and shows what
happened: counts and rate, the retries of a few deliberately flaky jobs,
one dead letter, the projected table and a query against it, and where the
files are. The handlers below double as an example `--app`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from jobspool.app import App
from jobspool.queue.context import Context
from jobspool.queue.job import Job
from jobspool.queue.signals import Fail, Retry

TABLE = "docs"
_WORDS = (
    "queue lease fence token spool worker batch commit replay prune recover durable file "
    "rename fsync directory lock process thread handler retry backoff jitter dead letter "
    "projection table version tombstone merge index compaction cleanup budget heartbeat "
    "outbox prepare abort cancel requeue claim complete fail release priority idle"
).split()


def index_doc(job: Job, ctx: Context) -> dict[str, Any]:
    """Project one document into the `docs` table (the demo's handler)."""
    doc = job.payload
    if doc.get("poison"):
        raise Fail("document body is not valid text (deliberately broken)")
    if doc.get("flaky") and job.attempts < 3:
        raise Retry("upstream search service timed out (deliberately flaky)", delay=0.2)
    words = doc["body"].split()
    top, _ = Counter(words).most_common(1)[0]
    ctx.upsert(TABLE, {"id": doc["doc_id"], "title": doc["title"], "words": len(words),
                       "top_word": top}, version=doc["rev"])
    return {"words": len(words)}


app = App(handlers={"doc": index_doc})


def make_docs(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        body = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 120)))
        docs.append({"doc_id": f"doc-{i:05d}", "title": f"note {i}: {rng.choice(_WORDS)}",
                     "body": body, "rev": 1, "flaky": i % 700 == 13,
                     # one broken document to show a dead letter, unless it would be all
                     "poison": n > 1 and i == n // 2})
    return docs


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class _Workers:
    """The demo's worker processes, stopped on the way out whatever ends the demo: a failed
    worker, Ctrl-C, SIGTERM (raised the way Ctrl-C is, `cli._terminated`). Left running, they
    went on draining the spool under init after the demo had said it was interrupted.
    Each one's stderr goes to a file: read one worker at a time, a pipe another filled
    with log lines would hold that worker up until its turn."""

    STOP_SECONDS = 10.0  # a worker's SIGTERM releases its leases; then SIGKILL

    def __init__(self, cmd: list[str], n: int) -> None:
        self.cmd, self.n = cmd, n
        self.procs: list[tuple[subprocess.Popen[bytes], Any]] = []

    def __enter__(self) -> list[tuple[subprocess.Popen[bytes], Any]]:
        try:
            for _ in range(self.n):
                errors = tempfile.TemporaryFile()
                try:
                    proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=errors,
                                            env=_child_env())
                except BaseException:
                    errors.close()
                    raise
                self.procs.append((proc, errors))
        except BaseException:
            self.__exit__()
            raise
        return self.procs

    def __exit__(self, *_: object) -> None:
        running = [p for p, _ in self.procs if p.poll() is None]
        for p in running:
            p.terminate()
        deadline = time.monotonic() + self.STOP_SECONDS
        for p in running:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for p, errors in self.procs:
            if p.stdout is not None:
                p.stdout.close()
            errors.close()


def run_demo(*, root: str | None, jobs: int, workers: int, as_json: bool,
             log_json: bool = False) -> int:
    from jobspool.pg import is_url
    from jobspool.queue.spool import Spool

    # A postgresql:// root runs the demo on that database (the projection then lives in
    # the spool's local directory); otherwise a directory, temporary by default.
    base: Path | str = (str(root) if is_url(root) else Path(root) if root
                        else Path(tempfile.mkdtemp(prefix="jobspool-demo-")) / "spool")
    # Logging JSON (`--log-format json`), the summary is one JSON line on stderr, as for
    # `worker` and `run-until-idle` (README), not text on stdout.
    say = (lambda *_: None) if as_json or log_json else print
    started = time.monotonic()
    # keep_terminal above the batch: the final counts then show every job (by default a
    # spool keeps the newest 1,000 of each terminal state and prunes older ones).
    with Spool(base, durable=True, retry_base_seconds=0.2, retry_max_seconds=1.0,
               keep_terminal=max(1000, jobs + 100)) as spool:
        if spool.stats().total:
            from jobspool.errors import SpoolError

            raise SpoolError(f"spool {getattr(spool, 'display', base)} already holds jobs; the "
                             "demo needs a new or empty one: give another --root, or leave "
                             "--root and JOBSPOOL_ROOT unset for a temporary one")
        # What is printed names the spool without its password (`PgSpool.display`).
        shown = str(getattr(spool, "display", base))
        docs = make_docs(jobs)
        t0 = time.monotonic()
        spool.enqueue_many("doc", docs)
        enqueue_s = time.monotonic() - t0
        say(f"enqueued {jobs} documents into {shown} in {enqueue_s:.2f} s "
            f"({jobs / enqueue_s:,.0f} jobs/s, durable)")
        say(f"running {workers} worker processes: jobspool run-until-idle --app jobspool.demo:app")
        cmd = [sys.executable, "-m", "jobspool", "--root", str(base), "run-until-idle",
               "--app", "jobspool.demo:app", "--json", "--wait-retries", "5",
               "--concurrency", "4", "--batch-size", "50"]
        t0 = time.monotonic()
        reports = []
        with _Workers(cmd, workers) as procs:
            for p, errors in procs:
                # No time limit: the workers run until the spool is idle, however long a
                # large --jobs takes (a fixed 300 s ended in a traceback, workers running on).
                out, _ = p.communicate()
                if p.returncode != 0:
                    errors.seek(0)
                    sys.stderr.write(errors.read().decode(errors="replace"))
                    say(f"a worker exited with {p.returncode}")
                    return 2
                reports.append(orjson.loads(out))
        run_s = time.monotonic() - t0
        stats = spool.stats()
        dead = list(spool.jobs(state="dead_letter"))
        flaky = [j for j in spool.jobs(state="completed") if j.attempts > 1]
        from jobspool.projection.lance import LanceProjection
        from jobspool.queue.layout import default_projection_of

        uri = default_projection_of(spool)
        table = LanceProjection(uri, TABLE)
        rows = table.count()
        long_docs = table.count("words > 100")
        sample = table.get("doc-00042")
    total = {k: sum(r[k] for r in reports) for k in
             ("claimed", "completed", "retried", "dead_lettered", "lease_lost", "projected_rows")}
    doc = {"root": shown, "projection": uri, "jobs": jobs, "workers": workers,
           "enqueue_seconds": round(enqueue_s, 3), "run_seconds": round(run_s, 3),
           "rate": round(total["completed"] / run_s, 1) if run_s else None,
           "per_worker": reports, "totals": total, "counts": stats.counts,
           "retried_jobs": [j.id for j in flaky],
           "dead_letters": [{"id": j.id, "error": j.last_error} for j in dead],
           "table_rows": rows, "rows_with_over_100_words": long_docs, "sample_row": sample,
           "seconds": round(time.monotonic() - started, 2)}
    if log_json:
        from jobspool.logs import summary

        summary("demo", doc)
    if as_json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")
        return 0
    if log_json:
        return 0
    say("")
    for i, r in enumerate(reports, 1):
        say(f"  worker {i}: claimed {r['claimed']}, completed {r['completed']}, retried "
            f"{r['retried']}, dead-lettered {r['dead_lettered']}")
    say(f"drained in {run_s:.2f} s: {total['completed']} completed "
        f"({doc['rate']:,} jobs/s end to end, including worker start-up), "
        f"{total['retried']} retries, {total['dead_lettered']} dead letter, "
        f"{total['lease_lost']} lost leases")
    say("final counts: " + ", ".join(f"{k}={v}" for k, v in stats.counts.items() if v))
    for j in flaky[:5]:
        say(f"  flaky job {j.id} ({j.payload['doc_id']}) completed on attempt {j.attempts}")
    for j in dead:
        say(f"  dead letter {j.id} ({j.payload['doc_id']}): {j.last_error}")
        say(f"    inspect: jobspool --root {shown} show {j.id}")
        say(f"    retry:   jobspool --root {shown} requeue {j.id}")
    say(f"LanceDB table {TABLE!r} at {uri}: {rows} live rows, {long_docs} with over 100 words")
    if sample is not None:
        say(f"  get('doc-00042') -> title={sample['title']!r}, words={sample['words']}, "
            f"top_word={sample['top_word']!r}, version={sample.get('version')}, "
            f"fence={sample.get('fence')}")
    if isinstance(base, Path):
        say(f"job files: {base}/<state>/<id>.json   (try: jobspool --root {base} stats)")
    say(f"demo finished in {doc['seconds']} s")
    return 0
