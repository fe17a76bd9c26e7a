"""`jobspool migrate --to postgresql://...`: copy this spool's jobs to the PostgreSQL store."""

from __future__ import annotations

import argparse
from typing import Any

from jobspool.cli.common import EXIT_OK, UsageError, _open
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
        with Spool(args.to, create=True) as target:
            report = copy_jobs(source.jobs(), target,  # type: ignore[arg-type]
                               source_fence=source.fence_value())
    d = report.to_dict()
    _emit(args, d, f"copied {report.copied} job(s) to {args.to.split('@')[-1]} "
                   f"({report.unleased} leased ones as ready); {len(report.skipped)} already "
                   f"there left alone; token sequence at {report.fence}")
    return EXIT_OK
