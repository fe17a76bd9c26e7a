"""The commands that run handlers: `run-until-idle` and `worker`, with the logging they
start and the exit codes of a stop that left leases or handler threads behind.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from jobspool.cli.common import (
    EXIT_OK,
    EXIT_UNHEALTHY,
    Refused,
    UsageError,
    _given_root,
    _make_worker,
    _open,
    _open_waiting,
)
from jobspool.cli.render import _emit, handlers_print_to_stderr, interrupted_text


def _setup_logging(args: argparse.Namespace) -> None:
    from jobspool.logs import setup_logging, startup

    setup_logging(getattr(args, "log_level", "warning"), getattr(args, "log_format", "text"))
    startup(str(args.command), root=_given_root(args),
            **{k: getattr(args, k) for k in ("app", "concurrency", "batch_size", "kinds",
                                             "processes") if getattr(args, k, None) is not None})


def cmd_run_until_idle(args: argparse.Namespace) -> int:
    _setup_logging(args)
    from jobspool.progress import Progress
    from jobspool.queue.supervisor import StoreOutage

    # Opened at once, not waited for: a script told at once that its URL reaches nothing.
    with _open(args, create=args.create) as spool:
        db = getattr(spool, "db", None)
        if db is not None and args.wait_for_store < db.reconnect_seconds:
            # A database's statements retry a lost connection for `reconnect_seconds` (30)
            # before the worker hears of the outage: `--wait-for-store 3` took 34 s.
            db.reconnect_seconds = args.wait_for_store
        worker = _make_worker(args, spool)
        worker.grace_seconds = args.grace
        progress = None if args.json else Progress.for_stdout(spool, worker.kinds)
        try:
            with handlers_print_to_stderr(args):
                report = worker.run_until_idle(
                    args.max_jobs, wait_for_retries=args.wait_retries,
                    progress=progress.update if progress else None, handle_signals=True,
                    wait_for_store=args.wait_for_store)
        except StoreOutage as exc:
            raise Refused(f"{exc} (--wait-for-store {args.wait_for_store:g}); what it ran "
                          "before stands, the rest runs at the next run") from None
        finally:
            if progress:
                progress.close()
    doc = report.to_dict()

    def text() -> str:
        lines = [f"claimed {report.claimed}, completed {report.completed}, retried "
                 f"{report.retried}, dead-lettered {report.dead_lettered}, lease lost "
                 f"{report.lease_lost}, released {report.released}"
                 f"{interrupted_text(report.interrupted)} in {report.duration:.2f} s "
                 f"({report.rate:.0f} jobs/s)"]
        if report.projected_rows:
            lines.append(f"projected {report.projected_rows} rows")
        for kind, n in sorted(report.unhandled.items()):
            why = ("not in --kinds" if kind in worker.handlers
                   else f"no handler in --app {args.app}")
            lines.append(f"left {n} due job(s) of kind {kind!r}: {why}")
        # Not "came due after the run's last claim" when the run chose to leave them:
        # --wait-retries, offered for those, does nothing for these.
        later = report.waiting - report.waiting_due
        not_due = f" ({later} more not due yet)" if later else ""
        if report.waiting_due and worker.stopping:
            lines.append(f"left {report.waiting_due} due job(s) of its kinds: the run was "
                         f"stopped; run again for the rest{not_due}")
        elif (report.waiting_due and args.max_jobs is not None
              and report.claimed >= args.max_jobs):
            lines.append(f"left {report.waiting_due} due job(s) of its kinds: --max-jobs "
                         f"{args.max_jobs} reached; run again for more{not_due}")
        elif report.waiting and report.next_due_in:
            lines.append(f"left {report.waiting} job(s) not due yet (retries backing off, "
                         f"delayed jobs), the first in {report.next_due_in:.1f} s; "
                         "--wait-retries SECONDS waits for those due within SECONDS")
        elif report.waiting:
            why = "it came due after the run's last claim"
            if report.lease_lost:
                why += (f", or the run let it go: {report.lease_lost} lease(s) lost or "
                        "released by a handler, whose jobs it leaves for one lease's time, "
                        "at most 5 s")
            lines.append(f"left {report.waiting} job(s) of its kinds, the first due now "
                         f"({why}); run again, or --wait-retries SECONDS waits for those "
                         "due within SECONDS")
        return "\n".join(lines)

    _emit(args, doc, text)
    code = _unreleased_verdict(report)
    if report.deferred_left:
        # Not drained, and not for the jobs' fault: a script must not read it as done.
        print(f"jobspool: error: {report.deferred_left} job(s) deferred: the projection "
              "could not be written for its storage (see the log above); they run again once "
              "it is fixed", file=sys.stderr)
        code = EXIT_UNHEALTHY
    _exit_past_abandoned_handlers(code)
    return code


def cmd_worker(args: argparse.Namespace) -> int:
    _setup_logging(args)
    if args.processes is not None:  # even 1: supervised, restarted, hung handlers killed
        from jobspool.cli.pool import cmd_worker_pool

        return cmd_worker_pool(args)
    from jobspool.queue.worker import WorkerCrashed

    with _open_waiting(args, create=args.create, patience=args.wait_for_store) as spool:
        worker = _make_worker(args, spool)
        worker.grace_seconds = args.grace
        from jobspool.queue.poolchild import attach_child, report_to_supervisor

        # Reports to a `--processes N` supervisor, when it is one's child.
        to_supervisor = attach_child(worker)
        server = None
        if args.metrics_port is not None:
            from jobspool.metrics import serve_metrics

            try:
                server = serve_metrics(spool, args.metrics_host, args.metrics_port, worker)
            except OSError as exc:
                raise UsageError(f"--metrics-port {args.metrics_port}: cannot listen on "
                                 f"{args.metrics_host}:{args.metrics_port} "
                                 f"({exc.strerror})") from None
            if args.metrics_port == 0:  # a free port: nobody could find it otherwise
                logging.getLogger("jobspool.metrics").warning(
                    "--metrics-port 0: serving metrics on http://%s:%d/metrics",
                    args.metrics_host, server.port)
        try:
            with handlers_print_to_stderr(args):
                report = worker.run_forever(poll_seconds=args.poll, progress=to_supervisor)
        except WorkerCrashed as exc:
            raise Refused(str(exc)) from None
        finally:
            if server is not None:
                server.shutdown()
    # A pool child's stdout is its supervisor's: the report goes over the pool's pipe.
    if not report_to_supervisor(report.to_dict()):
        _emit(args, report.to_dict(), f"worker stopped: completed {report.completed}, "
                                      f"retried {report.retried}, dead-lettered "
                                      f"{report.dead_lettered}, released {report.released}"
                                      f"{interrupted_text(report.interrupted)}")
    code = _unreleased_verdict(report)
    _exit_past_abandoned_handlers(code)
    return code


def _unreleased_verdict(report: Any) -> int:
    """Exit 2 when leases could not be given back (a supervisor must not read it as a
    clean stop): those jobs wait for their leases to expire."""
    if not report.unreleased:
        return EXIT_OK
    print(f"jobspool: error: {report.unreleased} lease(s) could not be given back (the store "
          f"was unreachable); their jobs run again once the leases expire", file=sys.stderr)
    return EXIT_UNHEALTHY


def _exit_past_abandoned_handlers(code: int = EXIT_OK) -> None:
    """Exit now if sync handlers cut off by the grace period are still running.

    Their leases were released (another worker may be running those jobs
    already) and Python cannot stop a thread; waiting for them at
    interpreter exit would make `worker` ignore its own grace period.
    """
    from jobspool.queue.runs import handler_threads_running

    # Only handler threads: a runner parked between jobs or an idle pool thread of the
    # finished run ends by itself, and exiting for one would cut short whatever called
    # the command (a test calling the CLI in-process, for one).
    if handler_threads_running():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

