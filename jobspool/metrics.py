"""Prometheus metrics: `jobspool stats --prometheus` and `jobspool worker --metrics-port`.

Why `prometheus_client` rather than writing the format by hand: the text
exposition format has escaping rules for label values (backslash, quote,
newline — job kinds are safe, worker owners and hostnames need not be),
`# HELP`/`# TYPE` ordering, the `_total` suffix convention for counters and
float formatting (`+Inf`, `NaN`, exponent forms) that a hand-written
renderer gets subtly wrong, and the node_exporter textfile collector
rejects a whole file over one bad line. The library is already a
dependency, its `generate_latest` is the reference renderer, and its WSGI
server gives `--metrics-port` a correct `/metrics` endpoint (content
negotiation, gzip, `?name[]=` filtering) for free. We use a private
`CollectorRegistry` with one custom collector that reads the spool at
scrape time, so nothing is registered globally and no value is cached
between scrapes (except for the short `min_interval` of a served endpoint).

What is exported (all read from the spool directory at collection time):

- `jobspool_jobs{state,kind}` (gauge): jobs per state and kind;
- `jobspool_due_jobs`, `jobspool_oldest_due_age_seconds` (0 when nothing is
  due), `jobspool_dead_letters`, `jobspool_quarantined_files`,
  `jobspool_temp_files` (gauges);
- `jobspool_fence` (gauge): the last fencing token handed out; it only ever
  grows, one per claimed job, so `rate(jobspool_fence[5m])` is the claim rate;
- `jobspool_job_rescues{kind}` and `jobspool_job_retries{kind}` (gauges): the
  sum of `rescues` (expired-lease reclaims) and of `attempts - 1` over the
  jobs currently on disk. These are gauges, not counters, on purpose:
  retention pruning removes jobs, so the sums go down, and a counter that
  goes down reads as a reset to `rate()`, which would invent a spike;
- `jobspool_worker_<counter>_total{worker}` (counters): the run counters of
  live workers (`RunReport`: claimed, completed, retried, dead_lettered,
  lease_lost, released, projected_rows, crashes). A served endpoint reports
  its own worker directly; `stats --prometheus` reports every worker that
  published a snapshot under `<root>/metrics/` within `WORKER_STALE_SECONDS`
  (see `publish_worker_report`).

Cost: per-kind counts and the rescue/retry sums read every job file (one
pass, no lock held); terminal states are bounded by retention, so this is
O(live jobs + keep_terminal). A served endpoint caches the rendered page for
`min_interval` seconds so aggressive scrapers cannot turn this into load.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import make_wsgi_app

from jobspool.errors import one_line
from jobspool.queue.states import ALL_STATES, JobState

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from jobspool.queue.api import SpoolAPI as Spool
    from jobspool.queue.report import RunReport

METRICS_DIR = "metrics"
# The largest count taken from a snapshot (a file anyone may write): sums of a few such
# counters, over workers and an hour of minutes, stay far inside the 64 bits JSON is
# encoded with (counters each just under 2**63 added up past it: the dashboard's
# /api/overview was a 500 for an hour). 2**53 is also what a browser's numbers hold exactly.
MAX_COUNT = 2**53
WORKER_STALE_SECONDS = 300.0
_PID_MAX = 4_194_304  # Linux's highest pid_max (2**22)
WORKER_COUNTERS = ("claimed", "completed", "retried", "dead_lettered", "lease_lost",
                   "released", "interrupted", "projected_rows", "crashes")
_WORKER_HELP = {
    "claimed": "Jobs this worker claimed.",
    "completed": "Jobs this worker completed.",
    "retried": "Jobs this worker failed with a retry.",
    "dead_lettered": "Jobs this worker dead-lettered.",
    "lease_lost": "Results this worker discarded because the lease was lost.",
    "released": "Leases this worker gave back unfinished, no attempt counted.",
    "interrupted": "Runs a shutdown cut off past its grace (the attempt counted).",
    "projected_rows": "Rows this worker wrote to projection tables.",
    "crashes": "Times this worker's own machinery failed and was restarted.",
}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


# ---------------------------------------------------------------- collection


class SpoolCollector:
    """A prometheus_client collector reading one spool (and optionally one live worker)."""

    def __init__(self, spool: Spool, worker: object = None) -> None:
        self.spool = spool
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        spool = self.spool
        stats = spool.stats()
        per_kind: dict[str, dict[str, int]] = {}
        rescues: dict[str, int] = {}
        retries: dict[str, int] = {}
        for job in spool.jobs():  # one pass: counts, rescues and retries from the same reads
            per = per_kind.setdefault(job.kind, {})
            per[job.state.value] = per.get(job.state.value, 0) + 1
            rescues[job.kind] = rescues.get(job.kind, 0) + job.rescues
            retries[job.kind] = retries.get(job.kind, 0) + max(0, job.attempts - 1)

        jobs = GaugeMetricFamily("jobspool_jobs", "Jobs in the spool, per state and kind.",
                                 labels=["state", "kind"])
        for kind in sorted(per_kind):
            for state in ALL_STATES:  # every state, so a series drops to 0 instead of vanishing
                jobs.add_metric([state.value, kind], per_kind[kind].get(state.value, 0))
        yield jobs
        yield _gauge("jobspool_due_jobs", "Jobs claimable now (ready, and retryable past backoff).",
                     stats.due)
        yield _gauge("jobspool_oldest_due_age_seconds",
                     "How long the oldest due job has waited (0 when nothing is due).",
                     stats.oldest_due_age or 0.0)
        yield _gauge("jobspool_dead_letters", "Jobs in dead_letter/.",
                     stats.counts.get(JobState.DEAD_LETTER.value, 0))
        yield _gauge("jobspool_fence",
                     "Last fencing token handed out (grows by one per claimed job).", stats.fence)
        yield _gauge("jobspool_quarantined_files", "Unreadable files moved to quarantine/.",
                     stats.quarantined)
        yield _gauge("jobspool_temp_files", "Files in tmp/ (staging; a pile-up means crashes).",
                     stats.temp_files)
        yield _per_kind("jobspool_job_rescues",
                        "Expired-lease reclaims recorded on the jobs now in the spool.", rescues)
        yield _per_kind("jobspool_job_retries",
                        "Attempts beyond the first recorded on the jobs now in the spool.", retries)
        yield from _worker_families(self._worker_reports())

    def _worker_reports(self) -> dict[str, dict[str, Any]]:
        worker = self.worker
        if worker is not None:
            live = getattr(worker, "live_report", None)
            report = live() if callable(live) else None
            if report is None:
                return {}
            owner = str(getattr(worker, "owner", "") or f"pid-{os.getpid()}")
            return {owner: _report_counters(report)}
        return read_worker_reports(self.spool)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _per_kind(name: str, doc: str, values: dict[str, int]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["kind"])
    for kind in sorted(values):
        g.add_metric([kind], values[kind])
    return g


def _worker_families(reports: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    if not reports:
        return
    for counter in WORKER_COUNTERS:
        # CounterMetricFamily appends `_total` to the samples.
        c = CounterMetricFamily(f"jobspool_worker_{counter}", _WORKER_HELP[counter],
                                labels=["worker"])
        for owner in sorted(reports):
            value = reports[owner].get(counter, 0)
            if isinstance(value, int | float) and not isinstance(value, bool):
                c.add_metric([owner], value)
        yield c


def failing_projections(spool: Spool, *, stale_after: float = WORKER_STALE_SECONDS
                        ) -> list[str]:
    """Owners of fresh worker snapshots whose projection commits are failing for the
    projection's storage right now (`RunReport.projection_failing`)."""
    return [doc["owner"] for doc in _fresh_snapshots(spool, stale_after, None)
            if isinstance(doc.get("projection_failing"), int) and doc["projection_failing"] > 0]


def _report_counters(report: RunReport | dict[str, Any]) -> dict[str, Any]:
    if not isinstance(report, dict):
        d = asdict(report)
        return {k: d.get(k, 0) for k in WORKER_COUNTERS}
    # Read from a file: a counter that is not a count (1e30, an integer past 64 bits, which
    # orjson reads as a float) counts 0. Kept, it broke the dashboard's JSON for an hour.
    return {k: v if type(v := report.get(k, 0)) is int and 0 <= v <= MAX_COUNT else 0
            for k in WORKER_COUNTERS}


def registry_for(spool: Spool, worker: object = None) -> CollectorRegistry:
    """A private registry holding only the spool collector (nothing global is touched)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpoolCollector(spool, worker))
    return registry


def render_prometheus(spool: Spool, worker: object = None) -> str:
    """The Prometheus text exposition of a spool (what node_exporter's textfile collector reads)."""
    return generate_latest(registry_for(spool, worker)).decode("utf-8")


# ---------------------------------------------------------------- worker snapshots on disk


def metrics_dirs(spool: Spool) -> list[Path]:
    """Where worker snapshots of this spool are on this machine: its own directory, then
    (a database's spool) those of processes that named the database by another URL."""
    siblings = getattr(spool, "sibling_local_dirs", None)
    extra = siblings() if siblings is not None else []
    return [Path(spool.root) / METRICS_DIR, *(Path(d) / METRICS_DIR for d in extra)]


def _snapshot_path(spool: Spool, owner: str) -> Path:
    name = _SAFE_NAME.sub("_", owner)[:150]
    if name != owner:
        # Told apart by a digest of the owner itself: cleaned alone, `team/a` and `team_a`
        # shared one file, each worker's counters overwrote the other's, and the first to
        # exit deleted the other's live snapshot.
        name = f"{name}-{hashlib.sha256(owner.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"
    return Path(spool.root) / METRICS_DIR / (name + ".json")


def publish_worker_report(spool: Spool, owner: str, report: RunReport, *,
                          final: bool = False) -> None:
    """Write a worker's run counters to `<root>/metrics/<owner>.json` for `stats --prometheus`.

    Advisory data: replaced atomically (write to a sibling, rename) but not
    fsynced — losing the last snapshot in a power cut costs nothing. A
    worker calls this every few seconds, and with `final` on exit (its snapshot goes,
    its last counters stay in `<owner>.final` for the dashboard's throughput);
    a snapshot older than `WORKER_STALE_SECONDS` is ignored by readers, so a
    worker that died is dropped from the metrics.
    """
    from jobspool.queue.liveness import boot_id
    from jobspool.queue.perms import dir_mode, file_mode, make_dir, set_fd_mode

    path = _snapshot_path(spool, owner)
    # The spool's modes whatever the umask (issue 10): a PostgreSQL store's local directory
    # is private.
    access = getattr(spool, "access", "private")
    if not path.parent.is_dir():
        with contextlib.suppress(FileExistsError):
            make_dir(path.parent, dir_mode(access))
    doc = {"format": 1, "owner": owner, "pid": os.getpid(), "host": socket.gethostname(),
           "boot": boot_id(), "written_at": time.time(), **_report_counters(report),
           "projection_failing": int(getattr(report, "projection_failing", 0) or 0)}
    if final:
        # Beside the live snapshots, not among them (`.json`): health, the workers' list
        # and `stats --prometheus` see only those; the dashboard's throughput reads these.
        path = path.with_suffix(FINAL_SUFFIX)
        # When the run began: a dashboard started after it must not count its earlier jobs
        # twice (its backfill read them from the disk).
        doc["run_started_at"] = doc["written_at"] - float(getattr(report, "duration", 0.0) or 0.0)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                     file_mode(access))
        try:
            set_fd_mode(fd, file_mode(access))
            os.write(fd, orjson.dumps(doc))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        if final:
            # Whatever became of the final counters (a full disk): the live snapshot of a
            # worker that exited must go, or health took it for a stuck worker.
            remove_worker_report(spool, owner)
    if final:
        _drop_old_finals(path.parent)
        return
    remove_dead_worker_reports(spool, keep=path.name)


# A worker's counters at its exit: the dashboard's throughput counts what they add to its
# last snapshot (a `run-until-idle` shorter than the 5 s between snapshots had none, and
# was never counted). Kept for the hour the chart shows.
FINAL_SUFFIX = ".final"
FINAL_KEEP_SECONDS = 3600.0


def read_final_reports(spool: Spool, *, since: float
                       ) -> dict[str, tuple[float, float | None, dict[str, Any]]]:
    """Workers' last counters written at their exit since `since`: owner -> (when written,
    when the run began if known, counters)."""
    out: dict[str, tuple[float, float | None, dict[str, Any]]] = {}
    for doc in (d for directory in metrics_dirs(spool)
                for d in _docs(directory, _final_names(directory))):
        written, owner = doc.get("written_at"), doc.get("owner")
        if isinstance(written, int | float) and not isinstance(written, bool) \
                and isinstance(owner, str) and written >= since:
            began = doc.get("run_started_at")
            out[owner] = (float(written), float(began) if isinstance(began, int | float)
                          and not isinstance(began, bool) else None, _report_counters(doc))
    return out


def _docs(directory: Path, names: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects of these files of `directory`; unreadable or other ones skipped."""
    for name in names:
        try:
            doc = orjson.loads((directory / name).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(doc, dict):
            yield doc


def _final_names(directory: Path) -> list[str]:
    """The names of the final counters in `directory` (none when it cannot be listed)."""
    try:
        return [n for n in os.listdir(directory) if n.endswith(FINAL_SUFFIX)]
    except OSError:
        return []


def _drop_old_finals(directory: Path) -> None:
    """Remove final counters past the chart's hour, by their files' age."""
    cutoff = time.time() - FINAL_KEEP_SECONDS
    for name in _final_names(directory):
        with contextlib.suppress(OSError):
            if (directory / name).stat().st_mtime < cutoff:
                (directory / name).unlink()


def remove_dead_worker_reports(spool: Spool, *, keep: str | None = None) -> list[str]:
    """Remove the snapshots of workers that are provably gone; their owners.

    Gone means written on this host by a process that no longer exists, or
    before this host last booted (a SIGKILL or a power cut leaves the file
    behind, and health would call it `worker_stale` for good). An older
    release's snapshot (no host or boot; its owner names the host) is gone
    once stale if its pid is no process here. A snapshot from another host, or
    one whose pid exists, is left alone: health reports it once it goes stale. A worker
    in another PID namespace under the same host name and boot would look
    gone; losing its advisory snapshot costs nothing, it writes it again
    within seconds.
    """
    from jobspool.queue.liveness import boot_id

    directory = Path(spool.root) / METRICS_DIR
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json") and n != keep]
    except OSError:
        return []
    host, boot = socket.gethostname(), boot_id()
    gone: list[str] = []
    for name in names:
        try:
            doc = orjson.loads((directory / name).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if not isinstance(doc, dict) or not boot:
            continue
        pid = doc.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            continue
        if "host" not in doc and "boot" not in doc:
            # An older release's snapshot (owner "host:pid", no boot): gone when stale, of
            # this host, and its pid is no process (left alone, it kept health degraded
            # for good after an upgrade). Stale first: without a boot id the pid may be a
            # later process's.
            written = doc.get("written_at")
            if (not isinstance(written, int | float) or isinstance(written, bool)
                    or time.time() - written <= WORKER_STALE_SECONDS
                    or str(doc.get("owner", "")).split(":")[0] != host  # host:pid[:hex]
                    or pid == os.getpid() or _process_exists(pid)):
                continue
        elif doc.get("host") != host:
            continue
        elif doc.get("boot") == boot and (pid == os.getpid() or _process_exists(pid)):
            continue  # this boot, and the process is there: alive, or stuck for health to say
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
            gone.append(str(doc.get("owner", name)))
    return gone


def _process_exists(pid: int) -> bool:
    if not 0 < pid <= _PID_MAX:
        # No process has it (a hand-made or damaged file): os.kill raised OverflowError on a
        # pid past 64 bits, and 0 or a negative pid would probe a whole process group.
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists (another user's), or we cannot tell: keep its file
    return True


def remove_worker_report(spool: Spool, owner: str) -> None:
    """Remove a worker's snapshot (on a clean exit)."""
    with contextlib.suppress(FileNotFoundError):
        _snapshot_path(spool, owner).unlink()


def read_worker_reports(spool: Spool, *, stale_after: float = WORKER_STALE_SECONDS,
                        now: float | None = None) -> dict[str, dict[str, Any]]:
    """Fresh worker snapshots under `<root>/metrics/`, by owner; bad or stale files are skipped."""
    return {doc["owner"]: _report_counters(doc)
            for doc in _fresh_snapshots(spool, stale_after, now)}


def _fresh_snapshots(spool: Spool, stale_after: float,
                     now: float | None) -> Iterator[dict[str, Any]]:
    """The worker snapshots written within `stale_after` seconds (with an owner)."""
    wall = time.time() if now is None else now
    for directory in metrics_dirs(spool):
        yield from _fresh_in(directory, stale_after, wall)


def _fresh_in(directory: Path, stale_after: float, wall: float) -> Iterator[dict[str, Any]]:
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except OSError:  # none yet, or another's that this reader may not list
        return
    for doc in _docs(directory, names):
        written = doc.get("written_at")
        if not isinstance(written, int | float) or not isinstance(doc.get("owner"), str):
            continue
        if wall - written <= stale_after:
            yield doc


# ---------------------------------------------------------------- serving


class MetricsServer:
    """A `/metrics` HTTP endpoint in a daemon thread; `shutdown()` stops it and frees the port."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    def shutdown(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)


class _CachedCollector:
    """Re-collects at most once per `min_interval` seconds; scrapes in between get the copy."""

    def __init__(self, inner: SpoolCollector, min_interval: float) -> None:
        self._inner = inner
        self._min_interval = min_interval
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self._min_interval:
                self._families = list(self._inner.collect())
                self._at = now
            return iter(list(self._families))


def _answering(app: Callable[..., Any]) -> Callable[..., Any]:
    """`app`, answering 503 and one line when the spool cannot be read (moved, a state
    directory deleted): it was a bare 500 and a traceback on stderr at every scrape."""
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        try:
            return app(environ, start_response)
        except Exception as exc:  # the scrape fails; the worker goes on
            line = one_line(exc)
            logging.getLogger("jobspool.metrics").warning("metrics scrape failed: %s", line)
            body = f"# the spool cannot be read: {line}\n".encode()
            start_response("503 Service Unavailable", [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body)))])
            return [body]
    return guarded


def serve_metrics(spool: Spool, host: str = "127.0.0.1", port: int = 0, worker: object = None,
                  *, min_interval: float = 1.0) -> MetricsServer:
    """Serve the spool's metrics (and `worker`'s live counters) on http://host:port/metrics.

    Loopback by default: metrics name job kinds and hosts, so exposing them
    beyond the machine is a deliberate choice (`--metrics-host`). Raises
    `OSError` when the address cannot be bound (port in use, no such
    address). Port 0 picks a free port (see `.port`).
    """
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer

    class _Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Access logs would flood stderr at every scrape."""

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_CachedCollector(SpoolCollector(spool, worker), min_interval))
    server_class: type[WSGIServer] = ThreadingWSGIServer
    if ":" in host:
        import socket

        class _V6(ThreadingWSGIServer):
            address_family = socket.AF_INET6

        server_class = _V6
    httpd = make_server(host, port, _answering(make_wsgi_app(registry)), server_class,
                        handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, name="jobspool-metrics", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


__all__ = [
    "METRICS_DIR",
    "WORKER_COUNTERS",
    "MetricsServer",
    "SpoolCollector",
    "failing_projections",
    "publish_worker_report",
    "read_worker_reports",
    "registry_for",
    "remove_dead_worker_reports",
    "remove_worker_report",
    "render_prometheus",
    "serve_metrics",
]
