"""The commands: each parses nothing, calls the public API, renders the outcome.

The commands that run handlers live in `run.py` and the reading of `enqueue`'s
payload in `jobinput.py`; both are re-exported here, where the parser finds every
command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from jobspool.cli.common import (
    EXIT_OK,
    EXIT_UNHEALTHY,
    UsageError,
    _given_root,
    _load_app,
    _open,
    _root_spec,
    _waiting_for_lock,
)
from jobspool.cli.jobinput import _read_payload, _run_at
from jobspool.cli.render import (
    _emit,
    _job_doc,
    _job_line,
    _job_text,
    handlers_print_to_stderr,
    printable,
)
from jobspool.cli.run import _exit_past_abandoned_handlers as _exit_past_abandoned_handlers
from jobspool.cli.run import _setup_logging as _setup_logging
from jobspool.cli.run import cmd_run_until_idle as cmd_run_until_idle
from jobspool.cli.run import cmd_worker as cmd_worker

# ---------------------------------------------------------------- commands


def cmd_init(args: argparse.Namespace) -> int:
    from jobspool.queue.layout import SUBDIRS
    from jobspool.queue.spool import Spool
    from jobspool.queue.states import ALL_STATES

    root = _root_spec(args)
    opts = {k: v for k, v in (("lease_seconds", args.lease_seconds),
                              ("max_attempts", args.max_attempts),
                              ("keep_terminal", args.keep_terminal),
                              ("keep_terminal_seconds", args.keep_terminal_seconds),
                              ("keep_dead", args.keep_dead),
                              ("max_job_bytes", args.max_job_bytes))
            if v is not None}
    if isinstance(root, str):  # a PostgreSQL URL: init creates (or migrates) the schema
        if args.access is not None:
            raise UsageError("--access sets a spool directory's file modes; a postgresql:// "
                             "spool's access is the database's roles")
        from jobspool.pg.opening import repair_damage

        repair_damage(root, opts)  # a schema damaged by hand: made whole before opening
        with Spool(root, create=True, **opts) as spool:
            existed = not getattr(spool, "created", True)
            doc = {"root": getattr(spool, "display", root), "created": not existed,
                   "settings": _settings_dict(spool)}
            upgraded = getattr(spool, "upgraded_from", None)
            if upgraded is not None:
                from jobspool.pg.schema import SCHEMA_VERSION

                doc["upgraded"] = {"from": upgraded, "to": SCHEMA_VERSION}  # logged on open
    else:
        from jobspool.cli.owner import act_as_owner

        act_as_owner(root)
        existed = (root / "spool.json").exists()
        if args.access is not None:
            opts["access"] = args.access
        # A state directory deleted by hand is made again empty: said, not done silently
        # (the jobs it held are gone, and "already initialized" read as all well).
        missing = [d for d in SUBDIRS if existed and not (root / d).is_dir()]
        with Spool(root, create=True, **opts) as spool:
            doc = {"root": str(spool.root.resolve()), "created": not existed,
                   "settings": _settings_dict(spool)}
        if missing:
            doc["recreated"] = missing
            lost = any(d in {s.value for s in ALL_STATES} for d in missing)
            print(f"jobspool: warning: recreated missing {', '.join(d + '/' for d in missing)}"
                  + (" empty: the jobs a state directory held are gone" if lost else ""),
                  file=sys.stderr)
    if existed:
        # Settings are fixed at creation: show the stored ones, and say which given
        # values were not saved (they printed as if they had been).
        with Spool(root, create=False) as stored:
            kept = _settings_dict(stored)
        ignored = {k: v for k, v in opts.items() if k in kept and kept[k] != v}
        doc["settings"] = kept
        if ignored:
            doc["ignored"] = ignored
            shown = ", ".join(f"{k}={kept[k]!r} (given {v!r})" for k, v in ignored.items())
            print(f"jobspool: note: a spool's settings are fixed when it is created; kept "
                  f"{shown}", file=sys.stderr)
    _emit(args, doc, f"{'spool already initialized at' if existed else 'initialized spool at'} "
                     f"{doc['root']}")
    return EXIT_OK


def _settings_dict(spool: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spool.settings)


def cmd_enqueue(args: argparse.Namespace) -> int:
    from_stdin = args.payload == "-"
    # PAYLOAD_JSON is checked before the spool is opened; stdin only once the spool says
    # how large a job may be, so that no more than that is read of it.
    payload = None if from_stdin else _read_payload(args.payload)
    run_at = _run_at(args.run_at)
    unique = ([s.strip() for s in args.unique_states.split(",") if s.strip()]
              if args.unique_states is not None else None)
    if unique == []:  # "," or "": an empty set would make every existing job replaceable
        raise UsageError("--unique-states names no state (give e.g. ready,leased)")
    limits = {k: v for k, v in (("max_due", args.max_due), ("max_lag_seconds", args.max_lag))
              if v is not None}
    with _open(args, create=args.create, **limits) as spool:
        if from_stdin:
            payload = _read_payload("-", stdin_limit=spool.max_job_bytes)
        result = spool.enqueue_result(args.kind, payload, job_id=args.job_id, delay=args.delay,
                                      run_at=run_at, priority=args.priority,
                                      max_attempts=args.max_attempts,
                                      on_conflict=args.on_conflict, unique_states=unique,
                                      timeout=args.timeout)
    job = result.job
    if not result.created:
        # stdout stays `ID STATE` (scripts parse it); whether anything was written goes here.
        # A leased job cannot be replaced (it is running): that hint led to an exit 2.
        hint = ("it is running: cancel it first to replace it" if job.state.value == "leased"
                else "--on-conflict replace rewrites it")
        sys.stderr.write(f"jobspool: note: job {job.id!r} already exists ({job.status}); kept "
                         f"unchanged ({hint})\n")
    _emit(args, _job_doc(job), f"{job.id} {job.status}")
    return EXIT_OK


def cmd_recover(args: argparse.Namespace) -> int:
    _setup_logging(args)
    app = _load_app(args.app)
    with _open(args, create=args.create) as spool, handlers_print_to_stderr(args):
        report = spool.recover(replay=app.replay if app is not None else None)
    _emit(args, report.to_dict(), lambda: _report_text("recovered", report.to_dict()))
    return EXIT_OK


def _report_text(title: str, d: dict[str, Any]) -> str:
    counts = {k: (len(v) if isinstance(v, list | tuple | dict) else v) for k, v in d.items()
              if isinstance(v, int | list | tuple | dict) and not isinstance(v, bool)}
    return f"{title}: " + ", ".join(f"{k}={v}" for k, v in counts.items())


# How long `stats` and `fsck` wait for the spool lock before giving up, as `health` does:
# a cron exporter run every minute piled up behind a process stopped while holding it.
READ_LOCK_WAIT = 5.0
NOTICE_AFTER = 2.0  # when it says it waits (`lockwait.noticed`'s default)


def _lock_within_reach(spool: Any, command: str) -> None:
    """Refuse (exit 2, one line) when the file spool's lock stays held `READ_LOCK_WAIT` s."""
    from jobspool.errors import SpoolError
    from jobspool.queue import lockwait

    path = lockwait.held_too_long(spool, NOTICE_AFTER)
    if path is not None:
        _waiting_for_lock(NOTICE_AFTER)  # as any other take of the lock says it waits
        path = lockwait.held_too_long(spool, READ_LOCK_WAIT - NOTICE_AFTER)
    if path is not None:
        raise SpoolError(f"{command}: the spool lock {path} has been held for over "
                         f"{READ_LOCK_WAIT:g} s by another process (a long fenced block, or a "
                         "stopped or stuck process): nothing was read; `jobspool health` "
                         "says more", path=str(path))


def cmd_stats(args: argparse.Namespace) -> int:
    if args.prometheus and args.json:
        raise UsageError("stats: --prometheus and --json are two output formats; pick one")
    with _open(args, read_only=True) as spool:
        _lock_within_reach(spool, "stats")
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
        if stats.scheduled:
            lines.append(f"of retryable, {stats.scheduled} scheduled (delayed, not run yet) and "
                         f"{stats.retryable - stats.scheduled} retries")
        if getattr(stats, "retryable_sampled", None):
            lines.append(f"(due and scheduled among retryable estimated from "
                         f"{stats.retryable_sampled} of {stats.retryable} read)")
        for kind, per in sorted(stats.by_kind.items()):
            lines.append(f"  {kind}: " + ", ".join(f"{s}={n}" for s, n in per.items()))
        return "\n".join(lines)

    _emit(args, d, text)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    import itertools

    from jobspool.queue.jobprogress import read_progress

    with _open(args, read_only=True) as spool:
        # Each `--state` in turn (the last alone was listed, silently, for several); a job
        # once only (`retryable` and `scheduled` overlap).
        states = list(dict.fromkeys(args.state)) if args.state else [None]
        seen: set[str] = set()

        def listed() -> Iterator[Any]:
            for state in states:
                scheduled = state == "scheduled"  # a status, not a directory: retryable/
                for j in spool.jobs(state="retryable" if scheduled else state, kind=args.kind):
                    if (j.scheduled or not scheduled) and j.id not in seen:
                        if len(states) > 1:
                            seen.add(j.id)
                        yield j

        picked = itertools.islice(listed(), args.limit)
        if getattr(args, "log_format", "text") != "json":
            # Printed as read: held whole, 200,000 jobs took 400 MB (700 with --json).
            _stream_list(args, spool, picked)
            return EXIT_OK
        jobs = list(picked)
        progress = {j.id: p for j in jobs if (p := read_progress(spool.root, j)) is not None}
    docs = [_job_doc(j) for j in jobs]
    for d in docs:
        if d["id"] in progress:
            d["progress"] = progress[d["id"]].to_dict()
    _emit(args, docs, lambda: "\n".join(
        _job_line(j) + (f"  progress={progress[j.id].text()}" if j.id in progress else "")
        for j in jobs) if jobs else "no jobs")
    return EXIT_OK


def _stream_list(args: argparse.Namespace, spool: Any, jobs: Iterable[Any]) -> None:
    """`list` one job at a time: the text lines, or the same JSON array `_emit` writes."""
    from jobspool.cli.render import json_text, write_out
    from jobspool.queue.jobprogress import read_progress

    first = True
    for job in jobs:
        progress = read_progress(spool.root, job)
        if args.json:
            doc = _job_doc(job)
            if progress is not None:
                doc["progress"] = progress.to_dict()
            write_out(("[\n" if first else ",\n")
                      + "\n".join("  " + line for line in json_text(doc).split("\n")))
        else:
            write_out(_job_line(job) + (f"  progress={progress.text()}" if progress else "")
                      + "\n")
        first = False
    if args.json:
        write_out("[]\n" if first else "\n]\n", flush=True)
    elif first:
        write_out("no jobs\n", flush=True)
    else:
        write_out("", flush=True)


def cmd_show(args: argparse.Namespace) -> int:
    from jobspool.queue.jobprogress import read_progress
    from jobspool.queue.unreadable import unreported

    with _open(args, read_only=True) as spool, unreported():
        job = spool.get(args.job_id)
        progress = read_progress(spool.root, job)
    doc = _job_doc(job)
    if progress is not None:
        doc["progress"] = progress.to_dict()
    _emit(args, doc, lambda: _show_text(job, progress))
    return EXIT_OK


def _bulk(args: argparse.Namespace) -> bool:
    """Whether a cancel/requeue names filters (many jobs) rather than one ID."""
    filters = [f for f, v in (("--kind", args.kind), ("--state", args.state),
                              ("--older-than", args.older_than)) if v is not None]
    if filters and args.job_id:
        raise UsageError(f"{args.command} takes a job id or filters ({', '.join(filters)}), "
                         "not both")
    return bool(filters)


def _bulk_move(args: argparse.Namespace, spool: Any, verb: str) -> None:
    method = spool.cancel_matching if verb == "canceled" else spool.requeue_matching
    jobs = None
    try:
        jobs = method(kind=args.kind, states=args.state, older_than=args.older_than)
        _emit(args, {verb: [j.id for j in jobs], "count": len(jobs)},
              f"{verb} {len(jobs)} job(s)")
    except KeyboardInterrupt as exc:
        done = jobs if jobs is not None else getattr(exc, "moved", None)
        if done is not None:
            in_flight = getattr(exc, "in_flight", None)
            exc.done = (f"{verb} {len(done)} job(s)"  # type: ignore[attr-defined]
                        + (f"; job {in_flight} was in flight (`jobspool show {in_flight}` "
                           "says where it is)" if in_flight and jobs is None else ""))
        raise


def _show_text(job: Any, progress: Any = None) -> str:
    """`show`: one field a line, the run's progress, then the last failed run's traceback as
    Python printed it."""
    from jobspool.queue.job import evolve

    text = _job_text(evolve(job, traceback=None))
    if progress is not None:
        text += f"\n{'progress':>13}: {progress.text()}"
    if job.traceback:
        text += "\n    traceback:\n" + "\n".join(
            "      " + printable(line) for line in job.traceback.rstrip("\n").splitlines())
    return text


def cmd_cancel(args: argparse.Namespace) -> int:
    bulk = _bulk(args)
    if not bulk and not args.job_id:
        raise UsageError("cancel takes a job id, or --kind/--state/--older-than filters")
    with _open(args) as spool:
        if bulk:
            _bulk_move(args, spool, "canceled")
            return EXIT_OK
        job = spool.cancel(args.job_id)
    _emit(args, _job_doc(job), f"{job.id} canceled")
    return EXIT_OK


def cmd_requeue(args: argparse.Namespace) -> int:
    bulk = _bulk(args)
    if bulk and args.all_dead:
        raise UsageError("requeue --all-dead is every dead letter: drop it to use filters")
    if not bulk and bool(args.job_id) == bool(args.all_dead):
        raise UsageError("requeue takes a job id, --all-dead, or --kind/--state/--older-than "
                         "filters (one of them)")
    with _open(args) as spool:
        if bulk:
            _bulk_move(args, spool, "requeued")
        elif args.all_dead:
            jobs = spool.requeue_all()
            _emit(args, {"requeued": [j.id for j in jobs], "count": len(jobs)},
                  f"requeued {len(jobs)} dead letter(s)")
        else:
            job = spool.requeue(args.job_id)
            _emit(args, _job_doc(job), f"{job.id} requeued")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    with _open(args) as spool:
        report = spool.prune(keep=args.keep, older_than=args.older_than,
                             keep_dead=args.keep_dead)
    _emit(args, report.to_dict(), lambda: _report_text("pruned", report.to_dict()))
    return EXIT_OK


def cmd_fsck(args: argparse.Namespace) -> int:
    with _open(args, read_only=True) as spool:
        _lock_within_reach(spool, "fsck")
        report = spool.fsck()
    d = report.to_dict()
    # On a database every line says what to do itself (`init`, by hand): no crash leaves
    # files for `recover` there.
    hint = "" if getattr(spool, "url", None) else "\n(`jobspool recover` repairs what a crash left)"
    _emit(args, d, lambda: "spool is consistent" if report.ok
          else _problems_text(report.problems) + hint)
    return EXIT_OK if report.ok else EXIT_UNHEALTHY


# Problems `fsck` lists one per line; past this, a count. A writer killed three times in a
# bulk command left 600 stray temp files: 600 lines, and no word of how many or what next.
FSCK_LINES = 20


def _problems_text(problems: list[str]) -> str:
    shown = [f"  {p}" for p in problems[:FSCK_LINES]]
    if len(problems) > FSCK_LINES:
        shown.append(f"  ... and {len(problems) - FSCK_LINES} more (--json lists every one)")
    return f"spool has {len(problems)} problem(s):\n" + "\n".join(shown)


def cmd_health(args: argparse.Namespace) -> int:
    limits = {k: v for k, v in (("min_free_bytes", args.min_free_bytes),
                                ("min_free_percent", args.min_free_percent),
                                ("worker_stale", args.worker_stale)) if v is not None}
    with _open(args, read_only=True) as spool:
        health = spool.health(max_due_age=args.max_due_age, projection=args.projection,
                              lease_grace=args.lease_grace,
                              maintenance_cadence=args.maintenance_cadence,
                              max_maintenance_failures=args.max_maintenance_failures, **limits)
    _emit(args, health.to_dict(), lambda: health.text())
    return EXIT_OK if health.ok else EXIT_UNHEALTHY


def cmd_demo(args: argparse.Namespace) -> int:
    _setup_logging(args)
    from jobspool.demo import run_demo

    return run_demo(root=_given_root(args), jobs=args.jobs,
                    workers=args.workers, as_json=args.json,
                    log_json=getattr(args, "log_format", "text") == "json")

