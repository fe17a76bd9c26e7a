"""The `jobspool` command line (DESIGN §8). Commands call the public API only.

Exit codes: 0 success, 1 usage or bad input (one line, no traceback), 2 the
spool is unhealthy or an operation was refused.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson

from jobspool.errors import (
    Backpressure,
    InvalidTransition,
    JobspoolError,
    SpoolError,
)

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_UNHEALTHY = 2


class UsageError(Exception):
    """Bad command-line input: exit 1 with one line."""


class Refused(Exception):
    """An operation was refused or the spool is unhealthy: exit 2 with one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _number(cast: Callable[[str], float], noun: str, *, strictly_positive: bool
            ) -> Callable[[str], Any]:
    """An argparse type: a finite number of `cast`'s kind, positive or non-negative."""
    need = "a positive" if strictly_positive else "a non-negative"

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        ok = value > 0 if strictly_positive else value >= 0  # False for NaN too
        if not ok or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} must be {need} {noun.split()[-1]}")
        return value

    return parse


_positive_float = _number(float, "a number", strictly_positive=True)
_nonneg_float = _number(float, "a number", strictly_positive=False)
_positive_int = _number(int, "an integer", strictly_positive=True)
_nonneg_int = _number(int, "an integer", strictly_positive=False)


def _port(text: str) -> int:
    value = int(_nonneg_int(text))
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--root", default=argparse.SUPPRESS,
                        help="spool directory (default: $JOBSPOOL_ROOT)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output: one JSON document")
    logging_opts = _Parser(add_help=False)
    logging_opts.add_argument("--log-level", default="warning",
                              choices=("debug", "info", "warning", "error", "critical"))
    logging_opts.add_argument("--log-format", default="text", choices=("text", "json"))

    p = _Parser(prog="jobspool", description="A file-backed durable job queue with lease "
                "fencing, whose workers feed LanceDB tables.")
    p.add_argument("--root", default=None, help="spool directory (default: $JOBSPOOL_ROOT)")
    p.add_argument("--json", action="store_true", default=False,
                   help="machine-readable output: one JSON document")
    p.add_argument("--version", action="version", version=f"jobspool {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    c = sub.add_parser("init", parents=[common], help="create a spool directory")
    c.add_argument("--lease-seconds", type=_positive_float)
    c.add_argument("--max-attempts", type=_positive_int)
    c.add_argument("--keep-terminal", type=_nonneg_int)
    c.set_defaults(func=cmd_init)

    c = sub.add_parser("enqueue", parents=[common], help="add a job")
    c.add_argument("kind")
    c.add_argument("payload", nargs="?", default=None,
                   help="payload as JSON, or - to read it from stdin")
    c.add_argument("--id", dest="job_id")
    c.add_argument("--delay", type=_nonneg_float, default=0.0)
    c.add_argument("--priority", type=int, default=0)
    c.add_argument("--max-attempts", type=_positive_int)
    c.set_defaults(func=cmd_enqueue)

    for name, func, helptext in (
        ("run-until-idle", cmd_run_until_idle, "run handlers until no due job is left"),
        ("worker", cmd_worker, "run handlers until SIGTERM/SIGINT"),
    ):
        c = sub.add_parser(name, parents=[common, logging_opts], help=helptext)
        c.add_argument("--app", required=True, help="MODULE:ATTR naming the handlers")
        c.add_argument("--concurrency", type=_positive_int, default=4)
        c.add_argument("--batch-size", type=_positive_int, default=50)
        c.add_argument("--kinds", help="comma-separated kinds to handle (default: all the app has)")
        c.add_argument("--lease-seconds", type=_positive_float)
        c.add_argument("--projection", help="LanceDB URI for ctx.upsert/delete "
                       "(default: the app's, else <root>/index)")
        c.add_argument("--no-maintenance", action="store_true",
                       help="do not run the projection maintenance beat")
        if name == "run-until-idle":
            c.add_argument("--max-jobs", type=_nonneg_int)
            c.add_argument("--wait-retries", type=_nonneg_float, default=0.0, metavar="SECONDS",
                           help="also wait for retries that become due within SECONDS")
        else:
            c.add_argument("--grace", type=_nonneg_float, default=30.0, metavar="SECONDS",
                           help="on SIGTERM, let running handlers finish this long")
            c.add_argument("--metrics-port", type=_port,
                           help="serve Prometheus metrics on 127.0.0.1:PORT")
            c.add_argument("--metrics-host", default="127.0.0.1")
        c.set_defaults(func=func)

    c = sub.add_parser("recover", parents=[common, logging_opts],
                       help="repair after a crash (run on boot)")
    c.add_argument("--app", help="MODULE:ATTR whose replay hooks resolve prepared jobs")
    c.set_defaults(func=cmd_recover)

    c = sub.add_parser("stats", parents=[common], help="counts per state")
    c.add_argument("--by-kind", action="store_true")
    c.add_argument("--prometheus", action="store_true",
                   help="print the Prometheus text exposition format")
    c.set_defaults(func=cmd_stats)

    c = sub.add_parser("list", parents=[common], help="list jobs")
    c.add_argument("--state", choices=_state_names())
    c.add_argument("--kind")
    c.add_argument("--limit", type=_nonneg_int, default=None)
    c.set_defaults(func=cmd_list)

    c = sub.add_parser("show", parents=[common], help="show one job")
    c.add_argument("job_id")
    c.set_defaults(func=cmd_show)

    c = sub.add_parser("cancel", parents=[common], help="cancel a job")
    c.add_argument("job_id")
    c.set_defaults(func=cmd_cancel)

    c = sub.add_parser("requeue", parents=[common], help="run a dead or canceled job again")
    c.add_argument("job_id", nargs="?")
    c.add_argument("--all-dead", action="store_true", help="requeue every dead letter")
    c.set_defaults(func=cmd_requeue)

    c = sub.add_parser("prune", parents=[common], help="remove old terminal jobs")
    c.add_argument("--keep", type=_nonneg_int)
    c.add_argument("--older-than", type=_nonneg_float, metavar="SECONDS")
    c.add_argument("--keep-dead", type=_nonneg_int, help="dead letters to keep (default: --keep)")
    c.set_defaults(func=cmd_prune)

    c = sub.add_parser("fsck", parents=[common], help="check the spool's invariants")
    c.set_defaults(func=cmd_fsck)

    c = sub.add_parser("maintain", parents=[common, logging_opts],
                       help="compact and clean the projection tables")
    c.add_argument("--projection", help="LanceDB URI (default: the app's, else <root>/index)")
    c.add_argument("--app", help="MODULE:ATTR (for its projection URI)")
    c.add_argument("--budget", type=_positive_float, default=60.0, metavar="SECONDS")
    c.add_argument("--tables", help="comma-separated table names (default: all)")
    c.set_defaults(func=cmd_maintain)

    c = sub.add_parser("health", parents=[common], help="ok / degraded, with reasons")
    c.add_argument("--max-due-age", type=_positive_float, default=300.0, metavar="SECONDS")
    c.add_argument("--projection", help="LanceDB URI whose maintenance state to check")
    c.add_argument("--lease-grace", type=_nonneg_float, default=0.0, metavar="SECONDS",
                   help="tolerate leases expired this long before calling them unreclaimed")
    c.add_argument("--maintenance-cadence", type=_positive_float, default=60.0,
                   metavar="SECONDS")
    c.add_argument("--max-maintenance-failures", type=_positive_int, default=3)
    c.set_defaults(func=cmd_health)

    c = sub.add_parser("demo", parents=[common, logging_opts],
                       help="run a realistic batch through two workers")
    c.add_argument("--jobs", type=_positive_int, default=3000)
    c.add_argument("--workers", type=_positive_int, default=2)
    c.set_defaults(func=cmd_demo)
    return p


def _version() -> str:
    from jobspool import __version__

    return __version__


def _state_names() -> list[str]:
    from jobspool.queue.states import JobState

    return [s.value for s in JobState]


# ---------------------------------------------------------------- output helpers


def _emit(args: argparse.Namespace, doc: Any, text: str | Callable[[], str]) -> None:
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str).decode()
                         + "\n")
    else:
        sys.stdout.write((text() if callable(text) else text).rstrip("\n") + "\n")


def _root(args: argparse.Namespace) -> Path:
    root = args.root or os.environ.get("JOBSPOOL_ROOT")
    if not root:
        raise UsageError("no spool given: pass --root DIR or set JOBSPOOL_ROOT")
    return Path(root)


def _open(args: argparse.Namespace, *, create: bool = False, **kwargs: Any) -> Any:
    from jobspool.queue.spool import Spool

    return Spool(_root(args), create=create, **kwargs)


def _job_line(job: Any) -> str:
    return (f"{job.id:<28} {job.state.value:<11} {job.kind:<16} attempts={job.attempts}/"
            f"{job.max_attempts} priority={job.priority}"
            + (f"  last_error={job.last_error[:60]!r}" if job.last_error else ""))


def _job_text(job: Any) -> str:
    d = job.to_dict()
    return "\n".join(f"{k:>13}: {orjson.dumps(v).decode() if not isinstance(v, str) else v}"
                     for k, v in d.items())


# ---------------------------------------------------------------- commands


def cmd_init(args: argparse.Namespace) -> int:
    from jobspool.queue.spool import Spool

    root = _root(args)
    existed = (root / "spool.json").exists()
    opts = {k: v for k, v in (("lease_seconds", args.lease_seconds),
                              ("max_attempts", args.max_attempts),
                              ("keep_terminal", args.keep_terminal)) if v is not None}
    with Spool(root, create=True, **opts) as spool:
        doc = {"root": str(spool.root.resolve()), "created": not existed,
               "settings": _settings_dict(spool)}
    _emit(args, doc, f"{'spool already initialized at' if existed else 'initialized spool at'} "
                     f"{doc['root']}")
    return EXIT_OK


def _settings_dict(spool: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spool.settings)


def _read_payload(text: str | None) -> Any:
    if text is None:
        return None
    raw = sys.stdin.read() if text == "-" else text
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        where = "stdin" if text == "-" else "PAYLOAD_JSON"
        raise UsageError(f"payload from {where} is not valid JSON: {exc}") from None


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = _read_payload(args.payload)
    with _open(args, create=True) as spool:
        job = spool.enqueue(args.kind, payload, job_id=args.job_id, delay=args.delay,
                            priority=args.priority, max_attempts=args.max_attempts)
    _emit(args, job.to_dict(), f"{job.id} {job.state.value}")
    return EXIT_OK


def _load_app(spec: str | None) -> Any:
    if spec is None:
        return None
    from jobspool.app import AppError, load_app

    try:
        return load_app(spec)
    except AppError as exc:
        raise UsageError(str(exc)) from None


def _make_worker(args: argparse.Namespace, spool: Any) -> Any:
    from jobspool.queue.worker import Worker

    app = _load_app(args.app)
    kinds = None
    if args.kinds:
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        missing = [k for k in kinds if k not in app.handlers]
        if missing:
            raise UsageError(f"--kinds names kinds the app has no handler for: "
                             f"{', '.join(missing)}")
    return Worker(spool, app, concurrency=args.concurrency, batch_size=args.batch_size,
                  kinds=kinds, lease_seconds=args.lease_seconds,
                  projection=args.projection or app.projection,
                  maintenance=not args.no_maintenance)


def _setup_logging(args: argparse.Namespace) -> None:
    from jobspool.logs import setup_logging

    setup_logging(getattr(args, "log_level", "warning"), getattr(args, "log_format", "text"))


def cmd_run_until_idle(args: argparse.Namespace) -> int:
    _setup_logging(args)
    from jobspool.progress import Progress

    with _open(args, create=True) as spool:
        worker = _make_worker(args, spool)
        progress = None if args.json else Progress.for_stdout(spool, worker.kinds)
        report = worker.run_until_idle(args.max_jobs, wait_for_retries=args.wait_retries,
                                       progress=progress.update if progress else None,
                                       handle_signals=True)
        if progress:
            progress.close()
    doc = report.to_dict()

    def text() -> str:
        lines = [f"claimed {report.claimed}, completed {report.completed}, retried "
                 f"{report.retried}, dead-lettered {report.dead_lettered}, lease lost "
                 f"{report.lease_lost}, released {report.released} in {report.duration:.2f} s "
                 f"({report.rate:.0f} jobs/s)"]
        if report.projected_rows:
            lines.append(f"projected {report.projected_rows} rows")
        for kind, n in sorted(report.unhandled.items()):
            lines.append(f"left {n} due job(s) of kind {kind!r}: no handler in this app")
        return "\n".join(lines)

    _emit(args, doc, text)
    _exit_past_abandoned_handlers()
    return EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    _setup_logging(args)
    import anyio

    from jobspool.queue.worker import WorkerCrashed

    with _open(args, create=True) as spool:
        worker = _make_worker(args, spool)
        worker.grace_seconds = args.grace
        server = None
        if args.metrics_port is not None:
            from jobspool.metrics import serve_metrics

            try:
                server = serve_metrics(spool, args.metrics_host, args.metrics_port, worker)
            except OSError as exc:
                raise UsageError(f"--metrics-port {args.metrics_port}: cannot listen on "
                                 f"{args.metrics_host}:{args.metrics_port} "
                                 f"({exc.strerror})") from None
        try:
            report = anyio.run(worker.run_forever)
        except WorkerCrashed as exc:
            raise Refused(str(exc)) from None
        finally:
            if server is not None:
                server.shutdown()
    _emit(args, report.to_dict(), f"worker stopped: completed {report.completed}, retried "
                                  f"{report.retried}, dead-lettered {report.dead_lettered}, "
                                  f"released {report.released}")
    _exit_past_abandoned_handlers()
    return EXIT_OK


def _exit_past_abandoned_handlers() -> None:
    """Exit now if sync handlers cut off by the grace period are still running.

    Their leases were released (another worker may be running those jobs
    already) and Python cannot stop a thread; waiting for them at
    interpreter exit would make `worker` ignore its own grace period.
    """
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)


def cmd_recover(args: argparse.Namespace) -> int:
    _setup_logging(args)
    app = _load_app(args.app)
    with _open(args, create=True) as spool:
        report = spool.recover(replay=dict(app.replay) if app is not None else None)
    _emit(args, report.to_dict(), lambda: _report_text("recovered", report.to_dict()))
    return EXIT_OK


def _report_text(title: str, d: dict[str, Any]) -> str:
    counts = {k: (len(v) if isinstance(v, list | tuple | dict) else v) for k, v in d.items()
              if isinstance(v, int | list | tuple | dict) and not isinstance(v, bool)}
    return f"{title}: " + ", ".join(f"{k}={v}" for k, v in counts.items())


def cmd_stats(args: argparse.Namespace) -> int:
    with _open(args) as spool:
        if args.prometheus:
            from jobspool.metrics import render_prometheus

            sys.stdout.write(render_prometheus(spool))
            return EXIT_OK
        stats = spool.stats(by_kind=args.by_kind)
    d = stats.to_dict()

    def text() -> str:
        lines = [f"{state:<12} {n:>9}" for state, n in stats.counts.items()]
        lines.append(f"{'total':<12} {stats.total:>9}")
        age = "-" if stats.oldest_due_age is None else f"{stats.oldest_due_age:.1f} s"
        lines.append(f"due now {stats.due}, oldest due {age}, fence {stats.fence}, "
                     f"quarantined {stats.quarantined}")
        for kind, per in sorted(stats.by_kind.items()):
            lines.append(f"  {kind}: " + ", ".join(f"{s}={n}" for s, n in per.items()))
        return "\n".join(lines)

    _emit(args, d, text)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    import itertools

    with _open(args) as spool:
        jobs = list(itertools.islice(spool.jobs(state=args.state, kind=args.kind), args.limit))
    _emit(args, [j.to_dict() for j in jobs],
          lambda: "\n".join(_job_line(j) for j in jobs) if jobs else "no jobs")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with _open(args) as spool:
        job = spool.get(args.job_id)
    _emit(args, job.to_dict(), lambda: _job_text(job))
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    with _open(args) as spool:
        job = spool.cancel(args.job_id)
    _emit(args, job.to_dict(), f"{job.id} canceled")
    return EXIT_OK


def cmd_requeue(args: argparse.Namespace) -> int:
    if bool(args.job_id) == bool(args.all_dead):
        raise UsageError("requeue takes a job id or --all-dead (one of them)")
    with _open(args) as spool:
        if args.all_dead:
            jobs = spool.requeue_all()
            _emit(args, {"requeued": [j.id for j in jobs]}, f"requeued {len(jobs)} dead letter(s)")
        else:
            job = spool.requeue(args.job_id)
            _emit(args, job.to_dict(), f"{job.id} requeued")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    with _open(args) as spool:
        report = spool.prune(keep=args.keep, older_than=args.older_than,
                             keep_dead=args.keep_dead)
    _emit(args, report.to_dict(), lambda: _report_text("pruned", report.to_dict()))
    return EXIT_OK


def cmd_fsck(args: argparse.Namespace) -> int:
    with _open(args) as spool:
        report = spool.fsck()
    d = report.to_dict()
    _emit(args, d, lambda: "spool is consistent" if report.ok else
          "spool has problems:\n" + "\n".join(f"  {p}" for p in report.problems))
    return EXIT_OK if report.ok else EXIT_UNHEALTHY


def _projection_uri(args: argparse.Namespace, spool: Any) -> str:
    from jobspool.queue.worker import default_projection_uri

    app = _load_app(getattr(args, "app", None))
    return str(args.projection or (app.projection if app and app.projection else None)
               or default_projection_uri(spool.root))


def cmd_maintain(args: argparse.Namespace) -> int:
    _setup_logging(args)
    with _open(args) as spool:
        uri = _projection_uri(args, spool)
        tables = [t for t in (args.tables or "").split(",") if t] or None
        from jobspool.projection.maintenance import maintain

        report = maintain(uri, tables=tables, budget_seconds=args.budget,
                          min_live_token=spool.min_live_token())
    d = report.to_dict() if hasattr(report, "to_dict") else {"report": str(report)}
    _emit(args, d, lambda: _maintain_text(report))
    return EXIT_OK if report.ok else EXIT_UNHEALTHY


def _maintain_text(report: Any) -> str:
    lines = [f"{t.table:<24} {t.outcome:<10} {t.reason}" for t in report.tables]
    if report.resume_at:
        lines.append(f"next run resumes at table {report.resume_at!r}")
    return "\n".join(lines) if lines else "no tables"


def cmd_health(args: argparse.Namespace) -> int:
    from jobspool.health import check_health

    with _open(args) as spool:
        health = check_health(spool, max_due_age=args.max_due_age, projection=args.projection,
                              lease_grace=args.lease_grace,
                              maintenance_cadence=args.maintenance_cadence,
                              max_maintenance_failures=args.max_maintenance_failures)
    _emit(args, health.to_dict(), lambda: health.text())
    return EXIT_OK if health.ok else EXIT_UNHEALTHY


def cmd_demo(args: argparse.Namespace) -> int:
    _setup_logging(args)
    from jobspool.demo import run_demo

    return run_demo(root=args.root or os.environ.get("JOBSPOOL_ROOT"), jobs=args.jobs,
                    workers=args.workers, as_json=args.json)


# ---------------------------------------------------------------- main


def _exit_code_for(exc: JobspoolError) -> int:
    from jobspool.queue.worker import WorkerCrashed

    if isinstance(exc, SpoolError | InvalidTransition | Backpressure | WorkerCrashed):
        return EXIT_UNHEALTHY
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    import warnings

    from jobspool.errors import CorruptFileWarning

    # The same event is logged as a warning already; one line per bad file is enough.
    warnings.simplefilter("ignore", CorruptFileWarning)
    as_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
        if not hasattr(args, "json") or args.json is None:
            args.json = False
        return int(args.func(args))
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE, as_json)
    except Refused as exc:
        return _fail(str(exc), EXIT_UNHEALTHY, as_json)
    except JobspoolError as exc:
        return _fail(str(exc), _exit_code_for(exc), as_json)
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE, as_json)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        return _fail(f"{exc.strerror or exc}{where}", EXIT_UNHEALTHY, as_json)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


def _fail(message: str, code: int, as_json: bool) -> int:
    line = " ".join(message.split())
    if as_json:
        sys.stdout.write(orjson.dumps({"ok": False, "error": line, "exit": code}).decode() + "\n")
    sys.stderr.write(f"jobspool: error: {line}\n")
    return code
