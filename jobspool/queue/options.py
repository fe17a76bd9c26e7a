"""What a `Spool` is opened with, in two frozen groups that say what is persisted.

`SpoolSettings` (layout.py) is saved in `spool.json` when the spool is
created and is every later opener's default: an option given to `Spool()`
overrides it for that process only. `ProcessOptions` are never saved: they
describe how this process uses the spool (its clock, whether it flushes,
its backpressure thresholds, whether it may write).

`Spool`'s signature shows DESIGN §5's defaults (`lease_seconds=60.0`, ...);
those defaults are `_DefaultFloat`/`_DefaultInt` markers that read as their
value but mean "not given", so the value saved in `spool.json` wins.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobspool.errors import InvalidJob
from jobspool.queue.arguments import check_flag
from jobspool.queue.job import MAX_JOB_BYTES, validate_int, validate_seconds
from jobspool.queue.layout import SpoolSettings
from jobspool.queue.payload import MAX_JOB_BYTES_LIMIT, MAX_RUN_AT


class Unset:
    """An option left out where None is a real value ("no limit"): the value saved in
    `spool.json` wins, else `default`. Reads as that default in `help(Spool)`."""

    __slots__ = ("default",)

    def __init__(self, default: Any) -> None:
        self.default = default

    def __repr__(self) -> str:
        return repr(self.default)


UNSET: Any = Unset(None)
UNSET_RESCUES: Any = Unset(10)


class DefaultFloat(float):
    """A default that reads as its value (in `help(Spool)`, DESIGN §5's signature) but means
    "not given": the value saved in `spool.json` then wins."""


class DefaultInt(int):
    """The integer form of `DefaultFloat`."""


# How a durable store flushes (store.py): per file, per filesystem, or chosen per batch.
SYNC_MODES = ("auto", "fsync", "syncfs")


@dataclass(frozen=True, slots=True)
class ProcessOptions:
    """How this process uses a spool; never persisted (see the module docstring)."""

    durable: bool = True
    clock: Callable[[], float] = field(default=time.time)
    sync_mode: str = "auto"
    seed: int | None = None
    read_only: bool = False
    max_due: int | None = None
    max_lag_seconds: float | None = None

    def __post_init__(self) -> None:
        check_flag("durable", self.durable)  # "false" is truthy: every flush was kept
        check_flag("read_only", self.read_only)
        if self.sync_mode not in SYNC_MODES:
            raise InvalidJob(f"sync_mode must be one of {', '.join(SYNC_MODES)}, got "
                             f"{self.sync_mode!r}", field="sync_mode")
        object.__setattr__(self, "clock", checked_clock(self.clock))
        if self.max_due is not None:
            validate_int("max_due", self.max_due, minimum=1)
        if self.max_lag_seconds is not None:
            validate_seconds("max_lag_seconds", self.max_lag_seconds, positive=True)


def checked_clock(clock: object) -> Callable[[], float]:
    """An injected clock whose every reading is checked: a time jobspool can write.

    Its readings become the jobs' times, and readers refuse a job whose times are not
    finite epoch seconds up to the year 9999: a clock returning NaN or milliseconds had
    every write succeed and the jobs it touched (a claimed one included) turn unreadable
    and be quarantined. A bad reading is refused before anything is written.
    """
    if not callable(clock):
        raise InvalidJob(f"clock must be a callable returning epoch seconds, got {clock!r}",
                         field="clock")
    if clock is time.time:
        return time.time
    name = getattr(clock, "__qualname__", None) or repr(clock)

    def now() -> float:
        try:
            value = clock()
        except Exception as exc:
            raise InvalidJob(f"the spool's clock ({name}) raised {type(exc).__name__}: {exc}",
                             field="clock") from exc
        hint = ""
        if not isinstance(value, bool) and isinstance(value, numbers.Real):
            reading = float(value)
            if 0.0 <= reading < MAX_RUN_AT:  # NaN fails too
                return reading
            hint = " (milliseconds?)" if MAX_RUN_AT <= reading < 1e300 else ""
        raise InvalidJob(f"the spool's clock ({name}) returned {value!r}: it must return epoch seconds, a "
                         f"finite number from 0 to the year 9999{hint}", field="clock")

    now.__wrapped__ = clock  # type: ignore[attr-defined]
    return now


# Options whose None means "no limit" (or "as keep_terminal"): given, not left out.
NULLABLE_OPTIONS = frozenset({"keep_terminal_seconds", "keep_dead", "max_rescues"})


def given_options(options: dict[str, Any]) -> dict[str, Any]:
    """The persisted options a caller gave: None counts for the nullable ones, as the file
    spool's `resolve_settings` reads them (PostgreSQL dropped `max_rescues=None`, kept
    the stored 10, and dead-lettered long jobs the caller meant never to cap)."""
    return {k: v for k, v in options.items()
            if given(v) or (v is None and k in NULLABLE_OPTIONS)}


def given(value: Any) -> bool:
    return (not isinstance(value, Unset) and value is not None
            and not isinstance(value, DefaultFloat | DefaultInt))


def check_given(options: dict[str, Any]) -> None:
    """Refuse a bad persisted option before anything is created on disk."""
    for name in ("lease_seconds", "retry_base_seconds", "retry_max_seconds",
                 "prepare_grace_seconds"):
        if given(options.get(name)):
            validate_seconds(name, options[name], positive=name == "lease_seconds")
    for name, low in (("max_attempts", 1), ("keep_terminal", 0), ("max_job_bytes", 1024),
                      ("keep_dead", 0)):
        if given(options.get(name)):
            validate_int(name, options[name], minimum=low,
                         maximum=MAX_JOB_BYTES_LIMIT if name == "max_job_bytes" else None)


def resolve_settings(options: dict[str, Any], stored: dict[str, Any], access: str
                     ) -> SpoolSettings:
    """This process's settings: each option given, else the one in `spool.json`, else
    DESIGN's default; every value validated (a hand-edited `spool.json` included)."""

    def pick(name: str, default: Any) -> Any:
        value = options.get(name)
        return value if given(value) else stored.get(name, default)

    def nullable(name: str, default: Any) -> Any:
        # None is a real value here ("no limit"): only a left-out option defers to the file.
        value = options.get(name, UNSET)
        return stored.get(name, default) if isinstance(value, Unset) else value

    kts = nullable("keep_terminal_seconds", None)
    kd = nullable("keep_dead", None)
    rescues = nullable("max_rescues", 10)
    return SpoolSettings(
        lease_seconds=validate_seconds("lease_seconds", pick("lease_seconds", 60.0),
                                       positive=True),
        max_attempts=validate_int("max_attempts", pick("max_attempts", 5), minimum=1),
        retry_base_seconds=validate_seconds("retry_base_seconds",
                                            pick("retry_base_seconds", 1.0)),
        retry_max_seconds=validate_seconds("retry_max_seconds",
                                           pick("retry_max_seconds", 300.0)),
        keep_terminal=validate_int("keep_terminal", pick("keep_terminal", 1000), minimum=0),
        max_rescues=None if rescues is None else validate_int("max_rescues", rescues,
                                                              minimum=1),
        prepare_grace_seconds=validate_seconds("prepare_grace_seconds",
                                               pick("prepare_grace_seconds", 300.0)),
        max_job_bytes=validate_int("max_job_bytes", pick("max_job_bytes", MAX_JOB_BYTES),
                                   minimum=1024),
        access=access,
        # Retention by age (issue 12): a terminal job younger than this is kept even beyond
        # the newest `keep_terminal`, so a result stays readable for a known time.
        keep_terminal_seconds=None if kts is None else validate_seconds(
            "keep_terminal_seconds", kts),
        keep_dead=None if kd is None else validate_int("keep_dead", kd, minimum=0),
    )
