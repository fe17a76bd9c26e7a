"""jobspool: a file-backed durable job queue with lease fencing, feeding LanceDB tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The spool and its records
from jobspool.queue.job import EnqueueResult, Job, Lease, Reservation
from jobspool.queue.signals import Fail, Retry
from jobspool.queue.spool import Spool
from jobspool.queue.states import JobState
from jobspool.queue.stats import Stats

if TYPE_CHECKING:
    from jobspool.app import App
    from jobspool.async_spool import AsyncSpool
    from jobspool.policy import Policy
    from jobspool.projection.lance import LanceProjection
    from jobspool.queue.worker import Context, RunReport, Worker
    from jobspool.schedules import Schedule

__version__ = "0.1.0"

__all__ = [
    # Running jobs
    "App",
    # Producers
    "AsyncSpool",
    "Context",
    "EnqueueResult",
    "Fail",
    # The spool and its records
    "Job",
    "JobState",
    # Reading what workers projected (LanceDB)
    "LanceProjection",
    "Lease",
    "Policy",
    "Reservation",
    "Retry",
    "RunReport",
    "Schedule",
    "Spool",
    "Stats",
    "Worker",
    "__version__",
]

_LAZY = {
    "Worker": "jobspool.queue.worker",
    "Context": "jobspool.queue.worker",
    "RunReport": "jobspool.queue.worker",
    "App": "jobspool.app",
    "LanceProjection": "jobspool.projection.lance",  # pulls in lancedb and pyarrow
    "Policy": "jobspool.policy",
    "AsyncSpool": "jobspool.async_spool",
    "Schedule": "jobspool.schedules",
}


def __getattr__(name: str) -> Any:
    # The worker pulls in anyio; keep `import jobspool` light for scripts that only enqueue.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jobspool' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
