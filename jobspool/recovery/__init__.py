"""Boot recovery, replay of prepared jobs, fsck and retention pruning."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobspool.recovery.prune import PruneReport
    from jobspool.recovery.recover import RecoveryReport

__all__ = ["PruneReport", "RecoveryReport"]

_LAZY = {"RecoveryReport": "jobspool.recovery.recover", "PruneReport": "jobspool.recovery.prune"}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        # Lazily: recover.py imports the queue, which imports parts of this package.
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'jobspool.recovery' has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(module), name)
