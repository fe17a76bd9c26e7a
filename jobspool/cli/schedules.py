"""`jobspool schedules --app MODULE:ATTR`: each periodic job with its last and next tick."""

from __future__ import annotations

import argparse
from typing import Any

from jobspool.cli.common import EXIT_OK, UsageError, _emit, _open


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register `schedules` on the CLI's subparsers."""
    c = sub.add_parser("schedules", parents=parents,
                       help="list the app's periodic jobs with their last and next tick")
    c.add_argument("--app", required=True, help="MODULE:ATTR naming the app and its schedules")
    c.set_defaults(func=cmd_schedules)


def cmd_schedules(args: argparse.Namespace) -> int:
    from jobspool.app import AppError, load_app
    from jobspool.schedules import Scheduler

    try:
        app = load_app(args.app)
    except AppError as exc:
        raise UsageError(str(exc)) from None
    with _open(args, read_only=True) as spool:
        rows = Scheduler(app.schedules).status(spool)

    def text() -> str:
        if not rows:
            return f"--app {args.app} has no schedules"
        lines = [f"{'NAME':<24} {'KIND':<20} {'RULE':<28} {'CATCH-UP':<8} {'LAST TICK':<24} "
                 "NEXT TICK"]
        for r in rows:
            lines.append(f"{r['name']:<24} {r['kind']:<20} {r['rule']:<28} {r['catch_up']:<8} "
                         f"{r['last_tick_iso'] or '-':<24} {r['next_tick_iso']}")
        return "\n".join(lines)

    _emit(args, rows, text)
    return EXIT_OK
