"""`Policy`: per-kind retry and time-limit settings (DESIGN §9).

A policy overrides, for the jobs of one kind, what the spool and the job say
by default: how many attempts a job gets, how long one run may take, the
backoff between attempts, and which exceptions are worth a retry at all.
`App(policies={kind: Policy(...)})` and `Worker(..., policies=...)` take
them; everything is checked when the app or worker is built, never mid-run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobspool.errors import PolicyError
from jobspool.queue.payload import MIN_TIMEOUT

__all__ = ["Policy", "PolicyError", "check_policies"]


@dataclass(frozen=True)
class Policy:
    """How the jobs of one kind are run and retried; `None` means "the spool's default".

    - `max_attempts`: attempts before a failing job is dead-lettered (overrides
      the job's own `max_attempts` for this worker's decisions).
    - `timeout`: seconds one run may take. Past it the run fails with
      `jobspool.errors.TimeLimitExceeded` (the retry rules below apply): an
      async handler is cancelled; a sync handler in a thread cannot be
      stopped, so its lease is given up and the thread is logged as hung —
      under `worker --processes N` its process is replaced instead.
    - `retry_base_seconds`, `retry_max_seconds`: the exponential backoff.
    - `retry_on`: exception classes worth a retry. When set, any other
      exception dead-letters the job at once (`Retry` and `Fail` keep their
      meaning). Include `TimeLimitExceeded` to retry runs that timed out.
    """

    max_attempts: int | None = None
    timeout: float | None = None
    retry_base_seconds: float | None = None
    retry_max_seconds: float | None = None
    retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None

    def __post_init__(self) -> None:
        if self.max_attempts is not None:
            v = self.max_attempts
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < (1 << 63):
                # Recorded on the job when it fails (JSON, a bigint column): 64 bits at most,
                # or no failure of the kind could ever be recorded.
                raise PolicyError(f"Policy max_attempts must be an integer from 1 to 2**63-1, "
                                  f"got {v!r}")
        for name in ("timeout", "retry_base_seconds", "retry_max_seconds"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _positive_seconds(name, value))
        if (self.retry_base_seconds is not None and self.retry_max_seconds is not None
                and self.retry_max_seconds < self.retry_base_seconds):
            raise PolicyError(f"Policy retry_max_seconds ({self.retry_max_seconds:g}) is below "
                              f"retry_base_seconds ({self.retry_base_seconds:g})")
        if self.retry_on is not None:
            object.__setattr__(self, "retry_on", _exception_classes(self.retry_on))

    def retries(self, exc: BaseException) -> bool:
        """Whether a run that raised `exc` may be retried under this policy."""
        from jobspool.queue.signals import RetryDelayRefused

        if self.retry_on is None or isinstance(exc, RetryDelayRefused):
            return True
        # normalized to a tuple in __post_init__ (`_exception_classes`)
        listed = self.retry_on if isinstance(self.retry_on, type) else tuple(self.retry_on)
        return isinstance(exc, listed)


def _positive_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(f"Policy {name} must be a number of seconds, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int past a float's range: a raw OverflowError named nothing
        raise PolicyError(f"Policy {name} must be a positive finite number of seconds, got an "
                          f"integer of {len(str(abs(value)))} digits") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and name == "timeout"):
        # A backoff of 0 retries at once, as `Spool(retry_base_seconds=0)` does: refused
        # here only, a kind could not have what the spool's default could.
        what = "positive" if name == "timeout" else "non-negative"
        raise PolicyError(f"Policy {name} must be a {what} finite number, got {value!r}")
    if name == "timeout" and v < MIN_TIMEOUT:
        raise PolicyError(f"Policy timeout must be at least {MIN_TIMEOUT:g} s (a limit shorter "
                          f"than starting the handler takes never lets it run), got {value!r}")
    if name != "timeout" and time.time() + v > _YEAR_9999:
        # The backoff lands in the job as its due time, which no reader takes past 9999.
        raise PolicyError(f"Policy {name} {value!r} would retry a job after the year 9999 "
                          "(was it given in milliseconds?)")
    return v


_YEAR_9999 = 253402300799.0  # jobspool.queue.payload.MAX_RUN_AT: this module stays a leaf


def _exception_classes(value: object) -> tuple[type[BaseException], ...]:
    items: Any = (value,) if isinstance(value, type) else value
    if isinstance(value, str | bytes):  # a name, not classes (iterating it named a letter)
        raise PolicyError(f"Policy retry_on must be an exception class or a tuple of them "
                          f"(the class itself, not its name), got {value!r}")
    try:
        classes = tuple(items)
    except TypeError:
        raise PolicyError(f"Policy retry_on must be an exception class or a tuple of them, "
                          f"got {value!r}") from None
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise PolicyError(f"Policy retry_on must hold exception classes, got {cls!r}")
    return classes


def check_policies(policies: Mapping[str, Policy] | None, kinds: Mapping[str, object]
                   ) -> dict[str, Policy]:
    """Validate a kind -> `Policy` mapping against the kinds that have handlers."""
    if policies is None:
        return {}
    if not isinstance(policies, Mapping):
        raise PolicyError(f"policies must be a mapping of kind -> Policy, "
                          f"got {type(policies).__name__}")
    out: dict[str, Policy] = {}
    for kind, policy in policies.items():
        if not isinstance(policy, Policy):
            raise PolicyError(f"policy for kind {kind!r} must be a jobspool.Policy, "
                              f"got {type(policy).__name__}")
        if kind not in kinds:
            known = ", ".join(sorted(map(repr, kinds))) or "none"
            raise PolicyError(f"policy for unknown kind {kind!r} (kinds with a handler: "
                              f"{known})")
        out[kind] = policy
    return out
