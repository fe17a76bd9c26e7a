"""`RunReport`: what a worker run did; and the live counters it is frozen from."""

from __future__ import annotations

import time
from collections.abc import Coroutine, Generator
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a worker run did."""

    claimed: int = 0
    completed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lease_lost: int = 0
    released: int = 0
    duration: float = 0.0
    projected_rows: int = 0
    crashes: int = 0
    timed_out: int = 0  # runs past their kind's time limit (DESIGN §9, Policy.timeout)
    # Leases the run could not give back on its way out (the store unreachable): their
    # jobs wait for the leases to expire, then run again.
    unreleased: int = 0
    # Given back uncounted because the projection's storage failed (read-only, full,
    # damaged): they run again once it is fixed. `deferred_left`: the jobs among them that
    # did not run again to an outcome within this run (`run-until-idle` exits 2 on any);
    # with storage that came back meanwhile, the run finished them.
    deferred: int = 0
    deferred_left: int = 0
    # Runs cut off by a shutdown past its grace: back to ready at once, the attempt
    # counted (`released` are give-backs that count none; they were one figure, and a
    # summary hid the attempts a shutdown had spent).
    interrupted: int = 0
    # Projection storage failures in a row right now (0 once a commit lands): health reads
    # it from the worker's metrics file (`projection_unwritable`).
    projection_failing: int = 0
    unhandled: dict[str, int] = field(default_factory=dict)
    # `run_until_idle` only: jobs of this worker's kinds left to run (retries backing off,
    # delayed jobs, one that came due after the last claim), and seconds until the first
    # of them is due (0: due now). A script
    # that ran once after a crash read "idle" as drained while the rescued jobs waited.
    waiting: int = 0
    next_due_in: float | None = None
    waiting_due: int = 0  # of `waiting`, those due when the run ended

    @property
    def rate(self) -> float:
        """Settled jobs per second."""
        settled = self.completed + self.retried + self.dead_lettered
        return settled / self.duration if self.duration > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rate"] = round(self.rate, 2)
        return d


class FinishedRun(RunReport, Coroutine[Any, Any, RunReport]):
    """The report of a `run_forever()` that already ran to its end, and also a coroutine.

    `run_forever()` called without a running loop serves synchronously and
    returns the report. The DESIGN's async form is `await worker.run_forever()`,
    so `asyncio.run(worker.run_forever())` must work too: the call served
    (blocking) before `asyncio.run` saw its argument, and this object, a
    coroutine that returns itself at once, keeps `asyncio.run` from refusing
    a plain report.
    """

    __slots__ = ()

    def send(self, value: Any) -> Any:
        raise StopIteration(self)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        raise typ if val is None else val

    def close(self) -> None:
        return None

    def __await__(self) -> Generator[Any, None, RunReport]:
        return self
        yield  # unreachable: makes this a generator that finishes at once with the report

    def __repr__(self) -> str:
        return "RunReport" + RunReport.__repr__(self).removeprefix(type(self).__name__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunReport):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(RunReport))

    __hash__ = None  # type: ignore[assignment]  # as RunReport's: its `unhandled` is a dict

    @classmethod
    def of(cls, report: RunReport) -> FinishedRun:
        return cls(**{f.name: getattr(report, f.name) for f in fields(RunReport)})


# The tallies a run keeps as it goes; `waiting` is looked up once, at the end.
_COUNTED = tuple(f.name for f in fields(RunReport)
                 if f.type in ("int", int)
                 and f.name not in ("waiting", "waiting_due", "deferred_left"))


class Counters:
    """The mutable tallies of a run in progress (one event loop writes them)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        for name in _COUNTED:
            setattr(self, name, 0)
        self.deferred_jobs: set[str] = set()  # deferred, not run again to an outcome yet

    claimed: int
    completed: int
    retried: int
    dead_lettered: int
    lease_lost: int
    released: int
    projected_rows: int
    crashes: int
    timed_out: int
    unreleased: int
    deferred: int
    interrupted: int
    projection_failing: int

    def freeze(self, unhandled: dict[str, int] | None = None, waiting: int = 0,
               next_due_in: float | None = None, waiting_due: int = 0) -> RunReport:
        counts = {name: getattr(self, name) for name in _COUNTED}
        return RunReport(**counts, duration=time.monotonic() - self.started,
                         unhandled=dict(unhandled or {}), waiting=waiting,
                         next_due_in=next_due_in, waiting_due=waiting_due,
                         deferred_left=len(self.deferred_jobs))
