"""`jobspool quarantine list|show ID|restore ID|purge [ID...]`: what recovery moved aside.

`list` and `show` need read access alone; `restore` and `purge` write. An
ID is a name from `list`, a unique prefix of one, or the id of the job the
file held when exactly one quarantined file has that name.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from jobspool.cli.common import EXIT_OK, _nonneg_float, _open
from jobspool.cli.render import _emit, _job_doc, printable


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register `quarantine` and its four actions on the top-level subparsers."""
    q = sub.add_parser("quarantine", parents=parents,
                       help="list, show, restore or purge files recovery moved aside")
    actions = q.add_subparsers(dest="action", metavar="ACTION", parser_class=type(q))
    actions.required = True

    c = actions.add_parser("list", parents=parents, help="every quarantined file, oldest first")
    c.set_defaults(func=cmd_list)

    c = actions.add_parser("show", parents=parents,
                           help="one file: where it came from, why, and its content")
    c.add_argument("ident", metavar="ID", help="a name from `quarantine list` (or a unique "
                   "prefix, or the job id)")
    c.set_defaults(func=cmd_show)

    c = actions.add_parser("restore", parents=parents,
                           help="move a repaired file back into the directory of its state")
    c.add_argument("ident", metavar="ID", help="a name from `quarantine list` (or a unique "
                   "prefix, or the job id)")
    c.set_defaults(func=cmd_restore)

    c = actions.add_parser("purge", parents=parents,
                           help="delete quarantined files for good (all when no ID is given)")
    c.add_argument("idents", metavar="ID", nargs="*", help="names from `quarantine list`")
    c.add_argument("--older-than", type=_nonneg_float, metavar="SECONDS",
                   help="only files quarantined more than SECONDS ago")
    c.set_defaults(func=cmd_purge)


def _core(spool: Any) -> Any:
    # Quarantine works on a file spool's journal; another store is passed as it is.
    from jobspool.queue.journal import journal_of

    return journal_of(spool) or spool


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds")


def cmd_list(args: argparse.Namespace) -> int:
    from jobspool.errors import shown_name
    from jobspool.recovery.quarantine import list_quarantined

    with _open(args, read_only=True) as spool:
        files = list_quarantined(_core(spool))

    def text() -> str:
        if not files:
            return "quarantine is empty"
        return "\n".join(f"{shown_name(q.name)}  from {shown_name(q.source)}  at "
                         f"{_when(q.quarantined_at)}  {q.size} B: {q.reason}" for q in files)

    _emit(args, {"count": len(files), "files": [q.to_dict() for q in files]}, text)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from jobspool.errors import shown_name
    from jobspool.recovery.quarantine import show_quarantined

    with _open(args, read_only=True) as spool:
        doc = show_quarantined(_core(spool), args.ident)

    def text() -> str:
        lines = [f"name: {shown_name(doc['name'])}", f"from: {shown_name(doc['source'])}",
                 f"quarantined at: {_when(doc['quarantined_at'])}",
                 f"reason: {doc['reason']}", f"size: {doc['size']} B",
                 "now readable: yes (`jobspool quarantine restore` puts it back)"
                 if doc["readable"] else f"now readable: no ({doc['problem']})",
                 "content" + (" (first 64 KiB)" if doc["truncated"] else "") + ":",
                 printable(doc["content"])]
        return "\n".join(lines)

    _emit(args, doc, text)
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    from jobspool.errors import shown_name
    from jobspool.recovery.quarantine import resolve, restore_quarantined

    with _open(args) as spool:
        name = resolve(_core(spool), args.ident)
        job = restore_quarantined(_core(spool), name)
    _emit(args, {"restored": name, "job": _job_doc(job)},
          f"restored {shown_name(name)} as {job.state.value}/{job.id}.json")
    return EXIT_OK


def cmd_purge(args: argparse.Namespace) -> int:
    from jobspool.recovery.quarantine import purge_quarantined

    with _open(args) as spool:
        purged = purge_quarantined(_core(spool), args.idents, older_than=args.older_than)
    _emit(args, {"count": len(purged), "purged": purged},
          f"purged {len(purged)} quarantined file(s)")
    return EXIT_OK
