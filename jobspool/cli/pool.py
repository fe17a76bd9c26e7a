"""`jobspool worker --processes N`: the command side of `jobspool.queue.pool.WorkerPool`."""

from __future__ import annotations

import argparse
import os
import sys

from jobspool.cli.common import EXIT_OK, EXIT_UNHEALTHY, Refused, UsageError, _open_waiting
from jobspool.cli.objectstore import child_env
from jobspool.cli.render import _emit, handlers_print_to_stderr, interrupted_text


def _child_options(args: argparse.Namespace) -> list[str]:
    """The worker options every child gets: the parent's, minus what only the parent does."""
    # A child claims only what it can start unless told otherwise: 50 ahead let one child
    # take every waiting job and run them one after another while its siblings sat idle
    # (and a child stuck on a hung handler kept 49 jobs leased and unstarted).
    batch = args.concurrency if args.batch_size is None else args.batch_size
    opts = ["--concurrency", str(args.concurrency), "--batch-size", str(batch),
            "--grace", repr(args.grace), "--poll", repr(args.poll), "--log-level", args.log_level,
            "--log-format", args.log_format, "--wait-for-store", repr(args.wait_for_store)]
    if args.kinds:
        opts += ["--kinds", args.kinds]
    if args.lease_seconds is not None:
        opts += ["--lease-seconds", repr(args.lease_seconds)]
    if args.projection:
        opts += ["--projection", args.projection]
    if args.no_maintenance:
        opts.append("--no-maintenance")
    return opts


def cmd_worker_pool(args: argparse.Namespace) -> int:
    from jobspool.cli.common import _make_worker
    from jobspool.queue.pool import PoolFailed, WorkerPool, child_command

    if getattr(args, "metrics_port", None) is not None:
        raise UsageError("--metrics-port is not supported with --processes yet; "
                         "run `jobspool stats --prometheus` for the spool's metrics")
    with _open_waiting(args, create=getattr(args, "create", True),
                       patience=args.wait_for_store) as spool:
        # Load the app here first: a bad --app, policy or kind is one line at start-up,
        # not N children failing in a restart loop.
        worker = _make_worker(args, spool)
        root = getattr(spool, "url", None) or spool.root.resolve()  # a database URL as given
        command = child_command(root, args.app, _child_options(args))
        try:
            with handlers_print_to_stderr(args):
                report = WorkerPool(spool, command, args.processes, grace_seconds=args.grace,
                                    policies=worker.policies,
                                    env={**os.environ, **child_env(args)},
                                    ignore_signals_after_stop=True).run()
        except PoolFailed as exc:
            raise Refused(str(exc)) from None
    d = report.to_dict()
    _emit(args, d, f"worker pool stopped: {report.processes} process(es), "
                   f"{report.restarts} restart(s), {report.killed_hung} killed for a hung "
                   f"handler; completed {d.get('completed', 0)}, retried "
                   f"{d.get('retried', 0)}, dead-lettered {d.get('dead_lettered', 0)}"
                   + interrupted_text(d.get("interrupted", 0)))
    # As a single worker does: held leases left behind are not a clean stop (a supervisor
    # restarting on failure must see it); their jobs run again once the leases expire.
    held = [f"{n} {what}" for n, what in (
        (d.get("unreleased", 0), "lease(s) could not be given back"),
        (d.get("unsettled_deaths", 0), "dead worker process(es) left leases unsettled")) if n]
    if not held:
        return EXIT_OK
    print(f"jobspool: error: {'; '.join(held)} (the store was unreachable); their jobs run "
          "again once the leases expire", file=sys.stderr)
    return EXIT_UNHEALTHY
