"""Queue adapters: one small class per queue under test, all with the same shape.

Adapters are imported lazily by name (see ``REGISTRY``) inside the child process
that uses them, so a missing optional peer only disables that peer.
"""

from __future__ import annotations

import importlib
from typing import Any

from bench.peers.base import Adapter

# name -> (module, class, constructor options, one-line description)
REGISTRY: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "jobspool": (
        "bench.peers.jobspool_adapter",
        "JobspoolAdapter",
        {"durable": True},
        "jobspool Spool, durable=True, batched claim/complete",
    ),
    "jobspool_nd": (
        "bench.peers.jobspool_adapter",
        "JobspoolAdapter",
        {"durable": False},
        "jobspool Spool, durable=False",
    ),
    "jobspool_fsync": (
        "bench.peers.jobspool_adapter",
        "JobspoolAdapter",
        {"durable": True, "sync_mode": "fsync"},
        "jobspool Spool, durable=True, sync_mode=fsync (per-file fsyncs)",
    ),
    "jobspool_syncfs": (
        "bench.peers.jobspool_adapter",
        "JobspoolAdapter",
        {"durable": True, "sync_mode": "syncfs"},
        "jobspool Spool, durable=True, sync_mode=syncfs",
    ),
    "sqlite_min": (
        "bench.peers.sqlite_min",
        "SqliteMinAdapter",
        {"per_job": True},
        "minimal SQLite queue: WAL, synchronous=FULL, UPDATE…RETURNING, one job per commit",
    ),
    "sqlite_min_batch": (
        "bench.peers.sqlite_min",
        "SqliteMinAdapter",
        {"per_job": False},
        "the same, one commit per batch (jobspool's batch size)",
    ),
    "persistqueue": (
        "bench.peers.persistqueue_adapter",
        "PersistQueueAdapter",
        {},
        "persist-queue SQLiteAckQueue(multithreading, auto_commit)",
    ),
    "litequeue_full": (
        "bench.peers.litequeue_adapter",
        "LiteQueueAdapter",
        {"synchronous": "FULL"},
        "litequeue, PRAGMA synchronous=FULL",
    ),
    "litequeue": (
        "bench.peers.litequeue_adapter",
        "LiteQueueAdapter",
        {},
        "litequeue, its default (synchronous=NORMAL)",
    ),
    "dirq": ("bench.peers.dirq_adapter", "DirqAdapter", {}, "dirq QueueSimple (no fsync)"),
    "naive": (
        "bench.peers.naive_files",
        "NaiveFilesAdapter",
        {},
        "naive file queue: reads every job file under the lock per call",
    ),
}

REFERENCE = "sqlite_min"


def open_adapter(name: str, root: str, **extra: Any) -> Adapter:
    """Build the adapter called ``name`` on ``root`` (imports its module now)."""
    module_name, class_name, options, _ = REGISTRY[name]
    cls = getattr(importlib.import_module(module_name), class_name)
    adapter: Adapter = cls(root, **{**options, **extra})
    return adapter


def available(name: str) -> str | None:
    """Return None if ``name``'s module imports here, else the reason it does not."""
    try:
        importlib.import_module(REGISTRY[name][0]).check_available()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
