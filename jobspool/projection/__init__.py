"""Projection of jobs into LanceDB tables: fenced, group-committed writes and maintenance.

The handler side (`PendingWrite`, `make_upsert`, `make_delete`, `LIVE_FILTER`)
imports neither LanceDB nor pyarrow. The store, the reader and maintenance
are loaded on first access, so importing this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobspool.projection.handler import (
    LIVE_FILTER,
    RESERVED_COLUMNS,
    PendingWrite,
    live_filter,
    make_delete,
    make_upsert,
)

if TYPE_CHECKING:
    from jobspool.projection.lance import ApplyResult, LanceProjection, ProjectionStore
    from jobspool.projection.maintenance import MaintenanceBeat, maintain
    from jobspool.projection.maintenance_state import (
        MaintenanceReport,
        TableOutcome,
        read_maintenance_state,
    )
    from jobspool.projection.objectstore import CommitRetry

_LAZY = {
    "ApplyResult": "jobspool.projection.lance",
    "LanceProjection": "jobspool.projection.lance",
    "ProjectionStore": "jobspool.projection.lance",
    "CommitRetry": "jobspool.projection.objectstore",
    "MaintenanceBeat": "jobspool.projection.maintenance",
    # the records and the state file load neither LanceDB nor pyarrow
    "MaintenanceReport": "jobspool.projection.maintenance_state",
    "TableOutcome": "jobspool.projection.maintenance_state",
    "maintain": "jobspool.projection.maintenance",
    "read_maintenance_state": "jobspool.projection.maintenance_state",
}


if not TYPE_CHECKING:  # a checker sees the names imported above, never an Any for a typo

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [  # noqa: RUF022 - grouped by weight: the first group never loads LanceDB
    # writes a handler makes (no LanceDB, no pyarrow)
    "LIVE_FILTER",
    "RESERVED_COLUMNS",
    "PendingWrite",
    "live_filter",
    "make_delete",
    "make_upsert",
    # the store and the reader (LanceDB, imported lazily)
    "ApplyResult",
    "LanceProjection",
    "ProjectionStore",
    "CommitRetry",
    # maintenance
    "MaintenanceBeat",
    "MaintenanceReport",
    "TableOutcome",
    "maintain",
    "read_maintenance_state",
]
