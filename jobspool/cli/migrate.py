"""`jobspool migrate --to postgresql://...`: copy this spool's jobs to the PostgreSQL store."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jobspool.cli.common import EXIT_OK, EXIT_UNHEALTHY, Refused, UsageError, _open
from jobspool.cli.render import _emit


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register `migrate` on the CLI's subparsers."""
    c = sub.add_parser("migrate", parents=parents,
                       help="copy this spool's jobs into a PostgreSQL spool (leased ones "
                       "arrive ready, their lease dropped)")
    c.add_argument("--to", required=True, metavar="URL",
                   help="the target, postgresql://user@host:port/db (its schema is created "
                   "when missing)")
    c.set_defaults(func=cmd_migrate)


def cmd_migrate(args: argparse.Namespace) -> int:
    from jobspool.pg import is_url

    if not is_url(args.to):
        raise UsageError(f"--to {args.to!r} is not a postgresql:// URL")
    from jobspool.pg.migrate import copy_jobs, copy_marks, stored_settings
    from jobspool.queue.marks import read_marks
    from jobspool.queue.spool import Spool

    with _open(args, read_only=True) as source:
        if is_url(getattr(source, "url", None)):
            raise UsageError("migrate copies a file spool: --root must be a directory")
        _refuse_live_processes(source)
        _refuse_live_leases(source)
        # The source's settings, stored if this creates the target (a file spool's
        # retention of 50,000 must not become the default 1,000 at the next prune).
        settings = {k: v for k, v in asdict(source.settings).items() if k != "access"}
        listed, quarantined = _listed(source)
        read: set[str] = set()

        def counted() -> Iterator[Any]:
            for job in source.jobs():
                read.add(job.id)
                yield job

        with Spool(args.to, create=True, **settings) as target:
            where = str(getattr(target, "display", "the database"))  # password hidden
            # Marks first: a copy interrupted after them fires no tick twice on the target.
            marks = copy_marks(read_marks(source.root, rules=True),
                               target)  # type: ignore[arg-type]
            report = copy_jobs(counted(), target,  # type: ignore[arg-type]
                               source_fence=source.fence_value(),
                               source=os.path.realpath(source.root))
            report.marks = marks
            created = bool(getattr(target, "created", False))
            stored = stored_settings(target) if not created else {}  # type: ignore[arg-type]
            differing = {k: (v, stored[k]) for k, v in settings.items()
                         if k in stored and stored[k] != v}
        unreadable, moved, gone = _not_read(source, listed - read)
        started = _workers_now(source)
        # Enqueued while the spool was read (a producer left running): not copied either.
        arrived = sorted(_listed(source)[0] - listed - read)
    d = {**report.to_dict(), "unreadable": len(unreadable), "quarantined": quarantined,
         "moved_during_copy": len(moved), "moved_ids": moved[:100],
         "removed_during_copy": len(gone), "workers_started_during_copy": started,
         "arrived_during_copy": len(arrived), "arrived_ids": arrived[:100],
         "settings": "copied" if created else "kept (the target existed)"}
    if not created and differing:
        shown = ", ".join(f"{k} {theirs} (the source's {mine})"
                          for k, (mine, theirs) in sorted(differing.items()))
        print(f"jobspool: note: the target spool keeps its own settings ({shown}): a "
              "spool's settings are fixed when it is created", file=sys.stderr)
    _notes(args, report, len(unreadable), quarantined, source.root)
    _during(moved, gone, started)
    if arrived:
        print(f"jobspool: warning: {len(arrived)} job(s) were added to the spool while it "
              f"was read and were NOT copied (e.g. {arrived[0]!r}); stop its producers, then "
              "run migrate again to copy them", file=sys.stderr)
    _emit(args, d, f"copied {report.copied} job(s) to {where} "
                   f"({report.unleased} leased ones as ready); {len(report.skipped)} already "
                   f"there ({len(report.updated)} of them brought up to the source's newer "
                   f"state); token sequence at {report.fence}")
    # Something was not copied that the user would lose by retiring the directory.
    return (EXIT_UNHEALTHY if report.conflicts or report.diverged or report.refused
            or unreadable or moved or started or arrived else EXIT_OK)


def _listed(source: Any) -> tuple[set[str], int]:
    """The ids of the job files the source lists (stale copies of a crash once) and how
    many files its quarantine holds: what `jobs()` did not yield of the first is what it
    could not read, or what moved or went while it read (`_not_read`)."""
    from jobspool.queue.states import ALL_STATES
    from jobspool.recovery.quarantine import quarantined_files

    names = source.journal.without_stale({s: source.store.names(s.value) for s in ALL_STATES})
    return {i for n in names.values() for i in n}, len(quarantined_files(source.journal))


def _not_read(source: Any, missed: set[str]) -> tuple[list[str], list[str], list[str]]:
    """The listed jobs the copy did not read, told apart: (unreadable, moved, gone). A job
    that moved to another state while the states were read (a cancel from another shell, a
    worker) reads fine now and a re-run copies it; one gone was removed meanwhile (pruned,
    purged). Before, all of them were "could not be read, see the warnings above", with no
    warning above, and `recover` found nothing to quarantine."""
    from jobspool.errors import JobNotFound, JobspoolError

    unreadable, moved, gone = [], [], []
    for job_id in sorted(missed):
        try:
            source.get(job_id)
        except JobNotFound:
            gone.append(job_id)
        except JobspoolError:
            unreadable.append(job_id)
        else:
            moved.append(job_id)
    return unreadable, moved, gone


def _workers_now(source: Any) -> list[str]:
    """Workers running on the source now: checked before the copy (refused), and after it,
    for one started meanwhile (jobs it ran may be ready on the database too)."""
    from jobspool import metrics

    metrics.remove_dead_worker_reports(source)
    return sorted(metrics.read_worker_reports(source))


def _during(moved: list[str], gone: list[str], started: list[str]) -> None:
    if started:
        print(f"jobspool: warning: {len(started)} worker(s) started on this spool during the "
              f"copy ({', '.join(started[:5])}): jobs they ran there may also be ready on "
              "PostgreSQL and run twice; stop them, then run migrate again (it brings the "
              "copied jobs up to the spool's newer state while no database worker has "
              "started them)", file=sys.stderr)
    if moved:
        print(f"jobspool: warning: {len(moved)} job(s) changed state while the spool was "
              f"read and were NOT copied (e.g. {moved[0]!r}); run migrate again to copy them",
              file=sys.stderr)
    if gone:
        print(f"jobspool: note: {len(gone)} job(s) were removed from the spool while it was "
              f"read (pruned or purged, e.g. {gone[0]!r}): nothing of them to copy",
              file=sys.stderr)


def _notes(args: argparse.Namespace, report: Any, unreadable: int, quarantined: int,
           root: Any) -> None:
    if report.conflicts:
        print(f"jobspool: warning: {len(report.conflicts)} job(s) were NOT copied: the target "
              f"holds another job under the same id (another kind or payload), e.g. "
              f"{report.conflicts[0]!r}; `--json` lists them", file=sys.stderr)
    if report.diverged:
        # Every one of them, here: this run records them as handled, so a later run (the
        # `--json` one a hint sent the operator to) no longer lists any.
        print(f"jobspool: warning: {len(report.diverged)} job(s) changed on both spools since "
              f"an earlier run of this migration (workers ran them on each); they were left "
              f"as the target has them: check each (a later run does not list them again): "
              f"{', '.join(sorted(report.diverged))}", file=sys.stderr)
    if report.refused:
        print(f"jobspool: warning: {len(report.refused)} job(s) were NOT copied: they hold "
              f"values the database cannot (e.g. {report.refused_why}); `--json` lists them",
              file=sys.stderr)
    if unreadable:
        print(f"jobspool: warning: {unreadable} job file(s) could not be read and were NOT "
              f"copied (see the warnings above; `jobspool recover` moves them to "
              f"quarantine/ for a look)", file=sys.stderr)
    if quarantined:
        print(f"jobspool: note: {quarantined} file(s) in {root}/quarantine were not copied "
              "(`jobspool quarantine list`)", file=sys.stderr)
    index = Path(root) / "index"
    if index.is_dir() and any(index.iterdir()):
        print(f"jobspool: note: the projection stays where it is ({index}): give workers on "
              f"PostgreSQL `--projection {index}` (or an s3:// copy of it), or they write a "
              "new one of their own", file=sys.stderr)


def _refuse_live_processes(source: Any) -> None:
    """Refuse (exit 2) while a worker runs on the spool (its metrics snapshot is fresh): an
    idle one holds no lease, yet would run on the file spool every job copied, which then
    ran twice. Other processes with the spool open (a producer) are named in a warning:
    what they add after the copy stays behind."""
    from jobspool import metrics
    from jobspool.queue import liveness

    # A worker killed (SIGKILL, a crash) leaves its snapshot fresh for minutes: one whose
    # process is gone from this host is no worker (migrate refused for five minutes).
    workers = _workers_now(source)
    if workers:
        shown = ", ".join(sorted(workers)[:5])
        raise Refused(f"{len(workers)} worker(s) are running on this spool ({shown}"
                      f"{', ...' if len(workers) > 5 else ''}): stop them first, then "
                      "migrate; every job copied would run twice, there and on PostgreSQL "
                      f"(one that cannot be told dead, of another host or an older "
                      f"release, counts until {metrics.WORKER_STALE_SECONDS:.0f} s after its "
                      f"last report in {Path(source.root) / metrics.METRICS_DIR})")
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
        held = first.lease.owner if first.lease else "?"
        until = max(job.lease.expires_at for job in live if job.lease is not None)
        raise Refused(f"{len(live)} job(s) are leased by a worker that may still be running "
                      f"them (e.g. {first.id}, held by {held}; the last of these leases "
                      f"expires in {max(0.0, until - now):.0f} s): stop the spool's workers "
                      "first, then migrate (a holder that cannot be checked, of another host "
                      "or an older release, counts until its lease expires)")
