"""`jobspool maintain`: compact, prune old versions and index a projection's tables."""

from __future__ import annotations

import argparse
import os
from typing import Any

from jobspool.cli.commands import _setup_logging
from jobspool.cli.common import EXIT_OK, EXIT_UNHEALTHY, UsageError, _load_app, _open
from jobspool.cli.render import _emit


def _app_projection(args: argparse.Namespace, spool: Any) -> tuple[str, Any, Any]:
    """The projection `maintain` works on: its URI, the store to maintain (None: open one on
    the URI) and the app (for its keys and storage options). An app's projection given as a
    `ProjectionStore` or a LanceDB connection is used as such: its `str()` was taken for a
    path ("no tables", exit 0), and an app's `keys` were left out (no key index built)."""
    from jobspool.projection.lance import ProjectionStore, uri_of
    from jobspool.queue.layout import default_projection_of

    app = _load_app(getattr(args, "app", None))
    given = app.projection if app and app.projection else None
    if args.projection or given is None:
        return str(args.projection or default_projection_of(spool)), None, app
    if isinstance(given, str | os.PathLike):
        return os.fspath(given), None, app
    uri = uri_of(given)
    if uri is None:
        raise UsageError(f"--app {args.app}: its projection does not say where it is; give "
                         "--projection")
    return uri, given if isinstance(given, ProjectionStore) else None, app


def cmd_maintain(args: argparse.Namespace) -> int:
    _setup_logging(args)
    with _open(args) as spool:
        from jobspool.cli.objectstore import storage_options

        uri, given, app = _app_projection(args, spool)
        options = storage_options(args, dict(app.storage_options or {}) if app else None)
        tables = [t for t in (args.tables or "").split(",") if t] or None
        from jobspool.projection.lance import ProjectionStore
        from jobspool.projection.maintenance import check_table_names, maintain
        from jobspool.projection.objectstore import local_path
        from jobspool.queue.layout import projection_inside_spool

        local = local_path(uri)
        named = (f"--projection {args.projection}" if args.projection
                 else f"--app {args.app}: its projection {uri}" if app and app.projection
                 else None)  # the default <root>/index: none yet is "no tables"
        if named and local is not None and not os.path.isdir(local):
            # Maintenance must not create a projection (a typo would become one), nor take
            # a typo in the app for a projection with nothing to maintain.
            raise UsageError(f"{named}: " + (
                "not a directory" if os.path.exists(local) else
                "no such directory (a typo? else nothing to maintain yet: the first write "
                "creates it)" if not args.projection else "no such directory"))
        inside = projection_inside_spool(spool.root, uri) if local is not None else None
        if inside is not None:
            raise UsageError(inside)
        try:
            check_table_names(tables or [])
        except ValueError as exc:
            raise UsageError(f"--tables: {exc}") from None
        if given is None:
            from jobspool.projection.spec import check_projection

            check_projection(uri)  # a URI with no bucket, a path that is a file: one line
        store = given or ProjectionStore(uri, storage_options=options,
                                         keys=dict(app.keys) if app else None)
        typo = _unknown_tables(store, tables) if tables else None
        if typo:
            # A name given that the projection does not hold, while it holds others: a
            # typo, which passed as "nothing to do" (exit 0). A projection with no table yet
            # (a cron line written before the first job) still passes. Refused before any
            # work: checked after, the other tables were maintained and their report lost.
            raise UsageError(f"--tables: {typo}")
        report = maintain(store, tables=tables, budget_seconds=args.budget,
                          min_live_token=spool.min_live_token())
    d = report.to_dict() if hasattr(report, "to_dict") else {"report": str(report)}
    _emit(args, d, lambda: _maintain_text(report))
    return EXIT_OK if report.ok else EXIT_UNHEALTHY


def _unknown_tables(store: Any, tables: list[str]) -> str | None:
    try:
        held = sorted(store.table_names())
    except Exception:  # maintenance reports what it finds; a listing fault is not a typo
        return None
    missing = [t for t in tables if t not in held]
    if not held or not missing:
        return None
    shown = ", ".join(held[:10]) + (", ..." if len(held) > 10 else "")
    return (f"no table named {', '.join(repr(m) for m in missing)} in the projection "
            f"(it holds: {shown})")


def _maintain_text(report: Any) -> str:
    lines = [f"{t.table:<24} {t.outcome:<10} {t.reason}" for t in report.tables]
    if report.resume_at:
        lines.append(f"next run resumes at table {report.resume_at!r}")
    return "\n".join(lines) if lines else "no tables"
