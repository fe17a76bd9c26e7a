"""`jobspool schedules --app MODULE:ATTR`: each periodic job with its last and next tick."""

from __future__ import annotations

import argparse
from typing import Any

from jobspool.cli.common import EXIT_OK, _load_app, _open
from jobspool.cli.render import _emit


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register `schedules` on the CLI's subparsers."""
    c = sub.add_parser("schedules", parents=parents,
                       help="list the app's periodic jobs with their last and next tick")
    c.add_argument("--app", required=True, help="MODULE:ATTR naming the app and its schedules")
    c.set_defaults(func=cmd_schedules)


def _last(row: dict[str, Any]) -> str:
    """`2026-12-01T03:00:00.000Z (completed)`; `(no job)`: passed over, or pruned."""
    if row["last_tick_iso"] is None:
        return "-"
    return f"{row['last_tick_iso']} ({row['last_job_state'] or 'no job'})"


def cmd_schedules(args: argparse.Namespace) -> int:
    from jobspool.schedules import Scheduler

    app = _load_app(args.app)
    with _open(args, read_only=True) as spool:
        rows = Scheduler(app.schedules).status(spool)

    def text() -> str:
        if not rows:
            return f"--app {args.app} has no schedules"
        table = [("NAME", "KIND", "RULE", "CATCH-UP", "LAST TICK", "NEXT TICK")]
        table += [(r["name"], r["kind"], r["rule"], r["catch_up"], _last(r),
                   r["next_tick_iso"] or "none (past the year 9999)") for r in rows]
        # Columns as wide as their widest cell: a long name or cron rule never shifts the rest.
        widths = [max(len(row[i]) for row in table) for i in range(5)]
        return "\n".join(" ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
                         + " " + row[5] for row in table)

    _emit(args, rows, text)
    return EXIT_OK
