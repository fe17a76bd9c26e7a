"""`jobspool migrate --to postgresql://...`: copy this spool's jobs to the PostgreSQL store."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from typing import Any

from jobspool.cli.common import EXIT_OK, Refused, UsageError, _open
from jobspool.cli.render import _emit


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register `migrate` on the CLI's subparsers."""
    c = sub.add_parser("migrate", parents=parents,
                       help="copy this spool's jobs (leases excluded) into a PostgreSQL spool")
    c.add_argument("--to", required=True, metavar="URL",
                   help="the target, postgresql://user@host:port/db (its schema is created "
                   "when missing)")
    c.set_defaults(func=cmd_migrate)


def cmd_migrate(args: argparse.Namespace) -> int:
    from jobspool.pg import is_url

    if not is_url(args.to):
        raise UsageError(f"--to {args.to!r} is not a postgresql:// URL")
    from jobspool.pg.migrate import copy_jobs
    from jobspool.queue.spool import Spool

    with _open(args, read_only=True) as source:
        if is_url(getattr(source, "url", None)):
            raise UsageError("migrate copies a file spool: --root must be a directory")
        _refuse_live_processes(source)
        _refuse_live_leases(source)
        # The source's settings, stored if this creates the target (a file spool's
        # retention of 50,000 must not become the default 1,000 at the next prune).
        settings = {k: v for k, v in asdict(source.settings).items() if k != "access"}
        with Spool(args.to, create=True, **settings) as target:
            report = copy_jobs(source.jobs(), target,  # type: ignore[arg-type]
                               source_fence=source.fence_value())
            created = bool(getattr(target, "created", False))
    d = {**report.to_dict(), "settings": "copied" if created else "kept (the target existed)"}
    if not created:
        print("jobspool: note: the target spool existed, so its own settings stay; the "
              "source's were not copied", file=sys.stderr)
    _emit(args, d, f"copied {report.copied} job(s) to {args.to.split('@')[-1]} "
                   f"({report.unleased} leased ones as ready); {len(report.skipped)} already "
                   f"there left alone; token sequence at {report.fence}")
    return EXIT_OK


def _refuse_live_processes(source: Any) -> None:
    """Refuse (exit 2) while a worker runs on the spool (its metrics snapshot is fresh): an
    idle one holds no lease, yet would run on the file spool every job copied, which then
    ran twice. Other processes with the spool open (a producer) are named in a warning:
    what they add after the copy stays behind."""
    from jobspool import metrics
    from jobspool.queue import liveness

    workers = metrics.read_worker_reports(source)
    if workers:
        shown = ", ".join(sorted(workers)[:5])
        raise Refused(f"{len(workers)} worker(s) are running on this spool ({shown}"
                      f"{', ...' if len(workers) > 5 else ''}): stop them first, then "
                      "migrate; every job copied would run twice, there and on PostgreSQL")
    others = liveness.alive_others(source.root)
    if others:
        shown = ", ".join(f"pid {d.get('pid', '?')} on {d.get('host', '?')}" for d in others[:5])
        print(f"jobspool: warning: {len(others)} other process(es) have this spool open for "
              f"writing ({shown}): jobs they add after this copy stay behind",
              file=sys.stderr)


def _refuse_live_leases(source: Any) -> None:
    """Refuse (exit 2) while a worker may still run the source's jobs: each job copied as
    ready would run twice, once there and once on PostgreSQL. An expired lease, or one
    whose holder is provably dead (its liveness lock is free), is copied as ready."""
    from jobspool.queue import liveness
    from jobspool.queue.states import JobState

    now = source.now()
    live = []
    for job in source.jobs(JobState.LEASED):
        lease = job.lease
        if lease is None or lease.expires_at <= now:
            continue
        verdict, _ = liveness.probe(source.root, lease.proc) if lease.proc else (
            liveness.Verdict.UNKNOWN, None)
        if verdict != liveness.Verdict.DEAD:
            live.append(job)
    if live:
        first = live[0]
        raise Refused(f"{len(live)} job(s) are leased by a worker that may still be running "
                      f"them (e.g. {first.id}, held by {first.lease.owner if first.lease else '?'}"
                      "); stop the spool's workers first, then migrate")
