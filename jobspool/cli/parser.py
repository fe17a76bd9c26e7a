"""`build_parser`: every command, its options and help."""

from __future__ import annotations

import argparse

from jobspool.cli import commands, maintain
from jobspool.cli.common import (
    _demo_workers,
    _lease_seconds,
    _listen_host,
    _nonneg_float,
    _nonneg_int,
    _Parser,
    _poll_seconds,
    _port,
    _positive_float,
    _positive_int,
    _projection_arg,
    _state_names,
    _version,
)
from jobspool.cli.objectstore import add_projection_option


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--root", default=argparse.SUPPRESS,
                        help="spool directory (default: $JOBSPOOL_ROOT)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output: one JSON document")
    logging_opts = _Parser(add_help=False)
    logging_opts.add_argument("--log-level", default="warning",
                              choices=("debug", "info", "warning", "error", "critical"),
                              help="least severe log events written to stderr (default: warning)")
    logging_opts.add_argument("--log-format", default="text", choices=("text", "json"),
                              help="stderr log lines as text, or one JSON object per line "
                              "(default: text)")
    create_opt = _Parser(add_help=False)
    create_opt.add_argument("--create", action="store_true",
                            help="create the spool when the root is not one yet (default: "
                            "refuse, so a mistyped root is not silently a new empty spool)")

    p = _Parser(prog="jobspool", description="A file-backed durable job queue with lease "
                "fencing, whose workers feed LanceDB tables.")
    p.add_argument("--root", default=None, help="spool directory (default: $JOBSPOOL_ROOT)")
    p.add_argument("--json", action="store_true", default=False,
                   help="machine-readable output: one JSON document")
    p.add_argument("--version", action="version", version=f"jobspool {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    c = sub.add_parser("init", parents=[common], help="create a spool directory")
    c.add_argument("--lease-seconds", type=_lease_seconds, metavar="SECONDS",
                   help="default lease length in seconds (default: 60)")
    c.add_argument("--max-attempts", type=_positive_int, metavar="N",
                   help="default attempts before a job is dead-lettered (default: 5)")
    c.add_argument("--keep-terminal", type=_nonneg_int, metavar="N",
                   help="completed and canceled jobs kept per state by retention "
                   "(default: 1000)")
    c.add_argument("--keep-dead", type=_nonneg_int, metavar="N",
                   help="dead letters kept by retention, their own limit (default: "
                   "--keep-terminal or 10000, whichever is larger)")
    c.add_argument("--keep-terminal-seconds", type=_nonneg_float, metavar="SECONDS",
                   help="retention also keeps every finished job younger than SECONDS, "
                   "beyond --keep-terminal (default: none, by count only)")
    c.add_argument("--access", choices=("private", "group", "group-read"),
                   help="who may use a new spool: its owner (directories 0700, files 0600), "
                   "also the owner's group (02770 / 0660), or the owner's group read-only "
                   "(02750 / 0640: for a health check or exporter); kept in spool.json "
                   "(default: private)")
    c.add_argument("--max-job-bytes", type=_positive_int, metavar="N",
                   help="the largest job file, serialized (at least 1024; default: 65536)")
    c.set_defaults(func=commands.cmd_init)

    c = sub.add_parser("enqueue", parents=[common, create_opt], help="add a job")
    c.add_argument("kind", help="the job's kind: which handler runs it")
    c.add_argument("payload", nargs="?", default=None,
                   help="payload as JSON, or - to read it from stdin")
    c.add_argument("--id", dest="job_id", metavar="ID",
                   help="the job id (enqueue is idempotent on it; default: a new time-ordered "
                   "id)")
    c.add_argument("--delay", type=_nonneg_float, default=0.0, metavar="SECONDS",
                   help="run no sooner than SECONDS from now (default: 0)")
    c.add_argument("--run-at", metavar="TIME",
                   help="run no sooner than TIME: ISO 8601 with a zone (2026-12-01T09:00:00Z) "
                   "or epoch seconds")
    c.add_argument("--on-conflict", choices=("keep", "replace", "error"), default="keep",
                   help="when --id is taken: keep the existing job (default), replace it "
                   "(not while it runs), or fail")
    c.add_argument("--unique-states", metavar="STATES",
                   help="comma-separated states in which an existing job counts as a "
                   "duplicate (default: all); in any other it is replaced")
    c.add_argument("--priority", type=int, default=0, metavar="N",
                   help="claim order: lower runs first (default: 0; negative allowed)")
    c.add_argument("--max-attempts", type=_positive_int, metavar="N",
                   help="attempts before dead-lettering (default: the spool's)")
    c.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                   help="time limit of each run of this job in seconds, over its kind's "
                   "policy (default: the policy's, else none)")
    c.add_argument("--max-due", type=_positive_int, metavar="N",
                   help="backpressure: refuse (exit 2, nothing written) while N or more jobs "
                   "are due and waiting (default: no limit)")
    c.add_argument("--max-lag", type=_positive_float, metavar="SECONDS",
                   help="backpressure: refuse (exit 2, nothing written) while the oldest due "
                   "job has waited SECONDS or more (default: no limit)")
    c.set_defaults(func=commands.cmd_enqueue)

    for name, func, helptext in (
        ("run-until-idle", commands.cmd_run_until_idle, "run handlers until no due job is left"),
        ("worker", commands.cmd_worker, "run handlers until SIGTERM/SIGINT"),
    ):
        c = sub.add_parser(name, parents=[common, logging_opts, create_opt], help=helptext)
        c.add_argument("--app", required=True, help="MODULE:ATTR naming the handlers")
        c.add_argument("--concurrency", type=_positive_int, default=4, metavar="N",
                       help="handlers running at once in this worker (default: 4)")
        c.add_argument("--batch-size", type=_positive_int, default=None, metavar="N",
                       help="jobs claimed per claim, at most (default: 50; with --processes, "
                       "--concurrency: a child claims only what it can start)")
        c.add_argument("--kinds", help="comma-separated kinds to handle (default: all the app has)")
        c.add_argument("--lease-seconds", type=_lease_seconds, metavar="SECONDS",
                       help="lease length in seconds, renewed every third of it while a "
                       "handler runs (default: the spool's)")
        c.add_argument("--projection", type=_projection_arg,
                       help="LanceDB URI for ctx.upsert/delete "
                       "(default: the app's, else <root>/index)")
        add_projection_option(c)  # object storage settings (jobspool/cli/objectstore.py)
        c.add_argument("--no-maintenance", action="store_true",
                       help="do not run the projection maintenance beat")
        c.add_argument("--grace", type=_nonneg_float, default=30.0, metavar="SECONDS",
                       help="on SIGTERM/SIGINT, let running handlers finish for up to SECONDS, "
                       "then release their leases; a second signal releases them at once "
                       "(default: 30)")
        if name == "run-until-idle":
            c.add_argument("--max-jobs", type=_nonneg_int, metavar="N",
                           help="stop after claiming N jobs (default: no limit)")
            c.add_argument("--wait-retries", type=_nonneg_float, default=0.0, metavar="SECONDS",
                           help="also wait for retries that become due within SECONDS")
            c.add_argument("--wait-for-store", type=_nonneg_float, default=30.0,
                           metavar="SECONDS",
                           help="during the run, wait up to SECONDS for a store that "
                           "cannot be reached or whose disk is full, then stop and exit 2 "
                           "(default: 30; one that cannot be reached at start is an error "
                           "at once)")
        else:
            c.add_argument("--processes", type=_positive_int, default=None, metavar="N",
                           help="supervise N worker processes, restarted when they die; a "
                           "sync handler past its time limit has its process replaced "
                           "(default: run in this process, no supervisor)")
            c.add_argument("--poll", type=_poll_seconds, default=0.5, metavar="SECONDS",
                           help="safety poll of an idle worker: claim again at least every "
                           "SECONDS even when no arrival woke it (default: 0.5)")
            c.add_argument("--wait-for-store", type=_nonneg_float, default=30.0,
                           metavar="SECONDS",
                           help="at start, wait up to SECONDS for a database that cannot be "
                           "reached yet, then exit 2 (default: 30; an outage once running "
                           "is waited out however long it lasts)")
            c.add_argument("--metrics-port", type=_port,
                           help="serve Prometheus metrics on 127.0.0.1:PORT")
            c.add_argument("--metrics-host", default="127.0.0.1", metavar="ADDRESS",
                           type=_listen_host,
                           help="address --metrics-port listens on (default: 127.0.0.1)")
        c.set_defaults(func=func)

    c = sub.add_parser("recover", parents=[common, logging_opts, create_opt],
                       help="repair after a crash (run on boot)")
    c.add_argument("--app", help="MODULE:ATTR whose replay hooks resolve prepared jobs")
    c.set_defaults(func=commands.cmd_recover)

    c = sub.add_parser("stats", parents=[common], help="counts per state")
    c.add_argument("--by-kind", action="store_true", help="also count per kind and state")
    c.add_argument("--prometheus", action="store_true",
                   help="print the Prometheus text exposition format (not with --json)")
    c.set_defaults(func=commands.cmd_stats)

    c = sub.add_parser("list", parents=[common], help="list jobs")
    c.add_argument("--state", choices=[*_state_names(), "scheduled"], action="append",
                   help="only jobs in this state (scheduled: delayed jobs not run yet, a part "
                   "of retryable); repeatable, listed state by state in the order given")
    c.add_argument("--kind", help="only jobs of this kind")
    c.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                   help="print at most N jobs (default: all)")
    c.set_defaults(func=commands.cmd_list)

    c = sub.add_parser("show", parents=[common], help="show one job")
    c.add_argument("job_id", metavar="ID", help="the job's id")
    c.set_defaults(func=commands.cmd_show)

    c = sub.add_parser("cancel", parents=[common],
                       help="cancel a job, or every unfinished job matching the filters")
    c.add_argument("job_id", nargs="?", metavar="ID", help="the job to cancel")
    _bulk_filters(c, "cancel", ("prepared", "ready", "retryable", "leased"),
                  "all four unfinished states")
    c.set_defaults(func=commands.cmd_cancel)

    c = sub.add_parser("requeue", parents=[common],
                       help="run a dead-lettered, canceled or completed job again, or every "
                       "one matching the filters")
    c.add_argument("job_id", nargs="?", metavar="ID", help="the job to requeue")
    c.add_argument("--all-dead", action="store_true", help="requeue every dead letter")
    _bulk_filters(c, "requeue", ("dead_letter", "canceled", "completed"), "dead_letter")
    c.set_defaults(func=commands.cmd_requeue)

    c = sub.add_parser("prune", parents=[common], help="remove old terminal jobs")
    c.add_argument("--keep", type=_nonneg_int, metavar="N",
                   help="newest jobs to keep per terminal state; with --older-than, a job goes "
                   "only when beyond N AND older (default: the spool's keep_terminal, and "
                   "keep_terminal_seconds as --older-than)")
    c.add_argument("--older-than", type=_nonneg_float, metavar="SECONDS",
                   help="remove only jobs finished more than SECONDS ago (alone: whatever "
                   "their number)")
    c.add_argument("--keep-dead", type=_nonneg_int, metavar="N",
                   help="dead letters to keep (default: the spool's keep_dead, whatever "
                   "--keep and --older-than say; they are evidence, pruned only when asked)")
    c.set_defaults(func=commands.cmd_prune)

    c = sub.add_parser("fsck", parents=[common], help="check the spool's invariants")
    c.set_defaults(func=commands.cmd_fsck)

    c = sub.add_parser("maintain", parents=[common, logging_opts],
                       help="compact and clean the projection tables")
    c.add_argument("--projection", type=_projection_arg,
                   help="LanceDB URI (default: the app's, else <root>/index)")
    add_projection_option(c)
    c.add_argument("--app", help="MODULE:ATTR (for its projection URI)")
    c.add_argument("--budget", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="stop starting new tables after SECONDS; the next run resumes "
                   "(default: 60)")
    c.add_argument("--tables", help="comma-separated table names (default: all)")
    c.set_defaults(func=maintain.cmd_maintain)

    c = sub.add_parser("health", parents=[common], help="ok / degraded, with reasons")
    c.add_argument("--max-due-age", type=_positive_float, default=300.0, metavar="SECONDS",
                   help="degraded when a due job has waited longer than SECONDS (default: 300)")
    c.add_argument("--projection", type=_projection_arg,
                   help="LanceDB URI whose maintenance state to check")
    c.add_argument("--lease-grace", type=_nonneg_float, default=0.0, metavar="SECONDS",
                   help="tolerate leases expired up to SECONDS ago before calling them "
                   "unreclaimed (default: 0)")
    c.add_argument("--maintenance-cadence", type=_positive_float, default=60.0,
                   metavar="SECONDS", help="how often maintenance is expected to run, in "
                   "seconds; degraded after 3x that without success (default: 60)")
    c.add_argument("--max-maintenance-failures", type=_positive_int, default=3, metavar="N",
                   help="degraded after N failed optimizes of a table in a row (default: 3)")
    c.add_argument("--min-free-bytes", type=_nonneg_int, default=None, metavar="BYTES",
                   help="degraded when the spool's filesystem has fewer free BYTES "
                   "(default: 100 MiB)")
    c.add_argument("--min-free-percent", type=_nonneg_float, default=None, metavar="PERCENT",
                   help="degraded when less than PERCENT of the filesystem is free "
                   "(default: 1)")
    c.add_argument("--worker-stale", type=_positive_float, default=None, metavar="SECONDS",
                   help="degraded when a worker's metrics file is older than SECONDS "
                   "(default: 60)")
    c.set_defaults(func=commands.cmd_health)

    c = sub.add_parser("demo", parents=[common, logging_opts],
                       help="run a realistic batch through two workers")
    c.add_argument("--jobs", type=_positive_int, default=3000, metavar="N",
                   help="jobs to run through (default: 3000)")
    c.add_argument("--workers", type=_demo_workers, default=2, metavar="N",
                   help="worker processes (default: 2, at most 64)")
    c.set_defaults(func=commands.cmd_demo)

    from jobspool.cli import quarantine

    quarantine.add_parser(sub, [common])

    from jobspool.cli import dashboard

    dashboard.add_parser(sub, [common, logging_opts])

    from jobspool.cli import schedules

    schedules.add_parser(sub, [common])

    from jobspool.cli import migrate

    migrate.add_parser(sub, [common])
    dashboard.add_demo_options(sub)
    return p


def _bulk_filters(c: argparse.ArgumentParser, action: str, states: tuple[str, ...],
                  default: str) -> None:
    """`--kind`, `--state` and `--older-than` for `cancel` / `requeue` of many jobs."""
    c.add_argument("--kind", help=f"{action} every job of this kind (with the other filters)")
    c.add_argument("--state", action="append", choices=states, metavar="STATE",
                   help=f"{action} jobs in STATE ({', '.join(states)}; repeatable; "
                   f"default: {default})")
    c.add_argument("--older-than", type=_nonneg_float, metavar="SECONDS",
                   help=f"{action} only jobs last changed more than SECONDS ago")

