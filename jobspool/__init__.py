"""jobspool: a file-backed durable job queue with lease fencing, feeding LanceDB tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Errors (jobspool.errors imports nothing else, so this stays light)
from jobspool.errors import (
    AppError,
    Backpressure,
    ConditionalPutUnsupported,
    ConfigError,
    CorruptFileWarning,
    DuplicateJob,
    FencedBlockBusy,
    HoldCut,
    InvalidJob,
    InvalidRoot,
    InvalidTransition,
    InvalidType,
    JobFailed,
    JobNotFound,
    JobPruned,
    JobspoolError,
    JobTooLarge,
    LeaseLost,
    NotQuarantined,
    ObjectStoreUnreachable,
    PolicyError,
    PoolFailed,
    ProjectionError,
    ProjectionUnusable,
    RunningLoopError,
    ScheduleError,
    SpoolClosed,
    SpoolError,
    StoreUnavailable,
    TimeLimitExceeded,
    UnreadableJob,
    WaitTimeout,
    WorkerCrashed,
    WorkerSpoolClosed,
    WriteFailed,
)

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
    from jobspool.recovery.prune import PruneReport
    from jobspool.recovery.recover import RecoveryReport
    from jobspool.schedules import Schedule, Scheduler

__version__ = "0.1.0"

# `__all__` is built group by group so each stays sorted (ruff RUF022) under its heading.
# The spool and its records
__all__ = ["EnqueueResult", "Job", "JobState", "Lease", "Reservation", "Spool", "Stats",
           "__version__"]
# Producers
__all__ += ["AsyncSpool"]
# Running jobs
__all__ += ["App", "Context", "Fail", "Policy", "Retry", "RunReport", "Schedule", "Scheduler",
            "Worker"]
# Reading what workers projected (LanceDB)
__all__ += ["LanceProjection"]
# What `recover` and `prune` return (DESIGN §5)
__all__ += ["PruneReport", "RecoveryReport"]
# Errors
__all__ += [
    "AppError",
    "Backpressure",
    "ConditionalPutUnsupported",
    "ConfigError",
    "CorruptFileWarning",
    "DuplicateJob",
    "FencedBlockBusy",
    "HoldCut",
    "InvalidJob",
    "InvalidRoot",
    "InvalidTransition",
    "InvalidType",
    "JobFailed",
    "JobNotFound",
    "JobPruned",
    "JobTooLarge",
    "JobspoolError",
    "LeaseLost",
    "NotQuarantined",
    "ObjectStoreUnreachable",
    "PolicyError",
    "PoolFailed",
    "ProjectionError",
    "ProjectionUnusable",
    "RunningLoopError",
    "ScheduleError",
    "SpoolClosed",
    "SpoolError",
    "StoreUnavailable",
    "TimeLimitExceeded",
    "UnreadableJob",
    "WaitTimeout",
    "WorkerCrashed",
    "WorkerSpoolClosed",
    "WriteFailed",
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
    "Scheduler": "jobspool.schedules",  # fires schedules by hand (a test's injected clock)
    "RecoveryReport": "jobspool.recovery.recover",
    "PruneReport": "jobspool.recovery.prune",
}


if not TYPE_CHECKING:  # a checker sees the names imported above, never an Any for a typo

    def __getattr__(name: str) -> Any:
        # The worker pulls in anyio; keep `import jobspool` light for scripts that only enqueue.
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'jobspool' has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
