"""`build_parser`: every command, its options and help."""

from __future__ import annotations

import argparse

from jobspool.cli import commands
from jobspool.cli.common import (
    _nonneg_float,
    _nonneg_int,
    _Parser,
    _port,
    _positive_float,
    _positive_int,
    _state_names,
    _version,
)


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
    c.set_defaults(func=commands.cmd_init)

    c = sub.add_parser("enqueue", parents=[common], help="add a job")
    c.add_argument("kind")
    c.add_argument("payload", nargs="?", default=None,
                   help="payload as JSON, or - to read it from stdin")
    c.add_argument("--id", dest="job_id")
    c.add_argument("--delay", type=_nonneg_float, default=0.0)
    c.add_argument("--priority", type=int, default=0)
    c.add_argument("--max-attempts", type=_positive_int)
    c.set_defaults(func=commands.cmd_enqueue)

    for name, func, helptext in (
        ("run-until-idle", commands.cmd_run_until_idle, "run handlers until no due job is left"),
        ("worker", commands.cmd_worker, "run handlers until SIGTERM/SIGINT"),
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
    c.set_defaults(func=commands.cmd_recover)

    c = sub.add_parser("stats", parents=[common], help="counts per state")
    c.add_argument("--by-kind", action="store_true")
    c.add_argument("--prometheus", action="store_true",
                   help="print the Prometheus text exposition format")
    c.set_defaults(func=commands.cmd_stats)

    c = sub.add_parser("list", parents=[common], help="list jobs")
    c.add_argument("--state", choices=_state_names())
    c.add_argument("--kind")
    c.add_argument("--limit", type=_nonneg_int, default=None)
    c.set_defaults(func=commands.cmd_list)

    c = sub.add_parser("show", parents=[common], help="show one job")
    c.add_argument("job_id")
    c.set_defaults(func=commands.cmd_show)

    c = sub.add_parser("cancel", parents=[common], help="cancel a job")
    c.add_argument("job_id")
    c.set_defaults(func=commands.cmd_cancel)

    c = sub.add_parser("requeue", parents=[common], help="run a dead or canceled job again")
    c.add_argument("job_id", nargs="?")
    c.add_argument("--all-dead", action="store_true", help="requeue every dead letter")
    c.set_defaults(func=commands.cmd_requeue)

    c = sub.add_parser("prune", parents=[common], help="remove old terminal jobs")
    c.add_argument("--keep", type=_nonneg_int)
    c.add_argument("--older-than", type=_nonneg_float, metavar="SECONDS")
    c.add_argument("--keep-dead", type=_nonneg_int, help="dead letters to keep (default: --keep)")
    c.set_defaults(func=commands.cmd_prune)

    c = sub.add_parser("fsck", parents=[common], help="check the spool's invariants")
    c.set_defaults(func=commands.cmd_fsck)

    c = sub.add_parser("maintain", parents=[common, logging_opts],
                       help="compact and clean the projection tables")
    c.add_argument("--projection", help="LanceDB URI (default: the app's, else <root>/index)")
    c.add_argument("--app", help="MODULE:ATTR (for its projection URI)")
    c.add_argument("--budget", type=_positive_float, default=60.0, metavar="SECONDS")
    c.add_argument("--tables", help="comma-separated table names (default: all)")
    c.set_defaults(func=commands.cmd_maintain)

    c = sub.add_parser("health", parents=[common], help="ok / degraded, with reasons")
    c.add_argument("--max-due-age", type=_positive_float, default=300.0, metavar="SECONDS")
    c.add_argument("--projection", help="LanceDB URI whose maintenance state to check")
    c.add_argument("--lease-grace", type=_nonneg_float, default=0.0, metavar="SECONDS",
                   help="tolerate leases expired this long before calling them unreclaimed")
    c.add_argument("--maintenance-cadence", type=_positive_float, default=60.0,
                   metavar="SECONDS")
    c.add_argument("--max-maintenance-failures", type=_positive_int, default=3)
    c.set_defaults(func=commands.cmd_health)

    c = sub.add_parser("demo", parents=[common, logging_opts],
                       help="run a realistic batch through two workers")
    c.add_argument("--jobs", type=_positive_int, default=3000)
    c.add_argument("--workers", type=_positive_int, default=2)
    c.set_defaults(func=commands.cmd_demo)
    return p

