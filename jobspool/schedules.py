"""Periodic jobs: `Schedule` (cron or fixed interval) and the `Scheduler` that fires them.

Any number of workers may run the same schedules; each tick still enqueues
exactly one job, by two means that do not depend on each other:

- the job id is derived from the schedule and the tick (`sched.<name>.<epoch>`),
  so two workers firing the same tick enqueue the same id and the second finds
  it taken (`on_conflict="keep"`);
- the last tick fired per schedule is recorded in `<root>/schedules.json`,
  read and advanced under the spool lock in the same hold as the enqueue, so a
  tick is never fired twice even after its job was completed and pruned.

A crash between the enqueue and the record leaves the record behind; the next
`tick` fires the same tick again and the id makes it a no-op.

Ticks are absolute times (cron in the schedule's time zone, intervals aligned
to the Unix epoch), so every worker computes the same ticks without talking to
the others. After downtime, `catch_up` says what happens to the ticks missed:
`"skip"` fires none of them (only a tick at most `grace_seconds` late counts as
on time; never less than `WAKE_SLACK_SECONDS`, what a worker's wake may lag),
`"once"` fires the latest one, `"all"` fires each, oldest first, up to
`max_catch_up` (the latest ones; a warning names the older ones skipped). A schedule
seen for the first time fires the tick happening now (at most `grace_seconds` late),
else starts with its next tick: deploying a daily 03:00 job at 10:00 does not run it
at once. A rule changed under
the same name (03:00 became 04:00 while the workers were down) fires, with "once" or
"all", its latest tick once if it falls after the old rule's last (its earlier ticks
are not missed ones: it did not exist), with "skip" as at first sight; the same rule
written another way (`0  3 * * *`, `0 3 * * 0-6`, `SUN` for 0) is no change.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Protocol

from jobspool.cron import CRON_MACROS as CRON_MACROS  # re-exported
from jobspool.cron import cron_canonical, cron_check, fingerprint
from jobspool.errors import Backpressure, InvalidJob, JobNotFound, JobspoolError, ScheduleError
from jobspool.queue.job import JOB_ID_RE, check_json, iso_time, validate_int, validate_kind
from jobspool.queue.marks import MARKS_FILE as MARKS_FILE  # re-exported
from jobspool.queue.marks import RULE_MARK
from jobspool.queue.marks import read_marks as read_marks  # re-exported

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI as Spool

log = logging.getLogger("jobspool.schedules")

CATCH_UP = ("skip", "once", "all")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


# How far ahead of the clock a schedule's last fired tick must be to count as a clock that
# was wrong (set ahead by mistake, then corrected) rather than one stepped back a little (an
# NTP correction, a VM restored with a stale clock) or the skew between machines sharing the
# marks. Up to this, the schedule waits for its mark: every tick up to it was fired already
# (by the clock that ran ahead), and a tick never fires twice, its job pruned or not. Beyond
# it, waiting would silence the schedule for as long (a year, after a one-year mistake).
CLOCK_JUMP_SECONDS = 86400.0
_BEHIND_LOGGED: dict[str, float] = {}  # schedule name -> when its wait was last logged


def _iso(tick: int) -> str:
    return datetime.fromtimestamp(tick, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# How late a worker's wake for a tick may be and the tick still count as on time, whatever
# a smaller `grace_seconds` says (a loaded machine wakes late by that much).
WAKE_SLACK_SECONDS = 5.0


@dataclass(frozen=True)
class Schedule:
    """Enqueue a job of `kind` on a cron expression or every `every` seconds.

    `cron` is a five-field expression (`"*/15 * * * *"`, parsed by cronsim) or
    a macro (`@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`) in the time
    zone `tz` (an IANA name, default UTC); `every` is a whole number
    of seconds (or a `timedelta`) with ticks aligned to the epoch. `payload` is
    each job's payload (JSON, the enqueue payload rule). `name` tells apart two
    schedules of one kind (default: the kind). See the module docstring for
    `catch_up`, `max_catch_up` and `grace_seconds`.
    """

    kind: str
    _: KW_ONLY
    cron: str | None = None
    every: float | timedelta | None = None
    payload: Any = None
    catch_up: str = "skip"
    max_catch_up: int = 100
    grace_seconds: float = 60.0
    name: str | None = None
    tz: str = "UTC"
    priority: int = 0
    _zone: tzinfo = field(init=False, repr=False, compare=False, default=UTC)
    _every: int = field(init=False, repr=False, compare=False, default=0)
    _expr: str = field(init=False, repr=False, compare=False, default="")  # macros expanded
    _rule_id: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        validate_kind(self.kind)
        label = f"schedule for kind {self.kind!r}"
        if (self.cron is None) == (self.every is None):
            raise ScheduleError(f"{label}: give exactly one of cron= or every=")
        if self.catch_up not in CATCH_UP:
            raise ScheduleError(f"{label}: catch_up {self.catch_up!r} must be one of "
                                f"{', '.join(CATCH_UP)}")
        if isinstance(self.max_catch_up, bool) or not isinstance(self.max_catch_up, int) \
                or not 1 <= self.max_catch_up <= 10_000:
            raise ScheduleError(f"{label}: max_catch_up must be an integer from 1 to 10000, "
                                f"got {self.max_catch_up!r}")
        if isinstance(self.grace_seconds, bool) or not isinstance(self.grace_seconds, int | float) \
                or not math.isfinite(self.grace_seconds) or self.grace_seconds < 0:
            raise ScheduleError(f"{label}: grace_seconds must be a non-negative number, "
                                f"got {self.grace_seconds!r}")
        if self.name is not None and (not isinstance(self.name, str)
                                      or _NAME_RE.fullmatch(self.name) is None):
            raise ScheduleError(f"{label}: name {self.name!r} must match "
                                "[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
        try:
            check_json(self.payload, "payload")
            validate_int("priority", self.priority)  # else every tick's enqueue would fail
        except JobspoolError as exc:
            raise ScheduleError(f"{label}: {exc}") from None
        object.__setattr__(self, "_zone", _zone(self.tz, label))
        if self.cron is not None:
            object.__setattr__(self, "_expr", cron_check(self.cron, label))
        else:
            object.__setattr__(self, "_every", _every_seconds(self.every, label))
            if self.tz != "UTC":
                # Interval ticks are aligned to the epoch, not to a zone's midnight: the
                # zone was taken and silently had no effect.
                raise ScheduleError(f"{label}: tz={self.tz!r} applies to cron schedules only "
                                    "(every= ticks are aligned to the epoch); use a cron "
                                    "expression for ticks at local times")
        # Once: `tick` compares it at every wake, and a cron rule's takes a parse.
        object.__setattr__(self, "_rule_id", fingerprint(
            f"cron {cron_canonical(self._expr)} {self.tz}" if self.cron is not None
            else f"every {self._every}"))

    # ------------------------------------------------------------ ticks

    @property
    def key(self) -> str:
        """The schedule's name in job ids and in `schedules.json` (its `name`, else its kind)."""
        return self.name or self.kind

    def describe(self) -> str:
        """`cron '0 * * * *' (UTC)` or `every 60 s`."""
        return (f"cron {self.cron!r} ({self.tz})" if self.cron is not None
                else f"every {self._every} s")

    def next_tick(self, after: float) -> int:
        """The first tick strictly after `after` (epoch seconds)."""
        if self.cron is None:
            return (math.floor(after) // self._every + 1) * self._every
        from cronsim import CronSim

        start = datetime.fromtimestamp(math.floor(after), self._zone)
        return int(next(CronSim(self._expr, start)).timestamp())

    def _due_to_log(self, now: float) -> bool:
        """At most one wait line per schedule every ten minutes (plan runs at every tick)."""
        last = _BEHIND_LOGGED.get(self.key)
        if last is not None and abs(now - last) < 600:
            return False
        _BEHIND_LOGGED[self.key] = now
        return True

    def last_tick(self, at: float) -> int:
        """The latest tick at or before `at`."""
        if self.cron is None:
            return (math.floor(at) // self._every) * self._every
        from cronsim import CronSim

        start = datetime.fromtimestamp(math.floor(at) + 1, self._zone)
        return int(next(CronSim(self._expr, start, reverse=True)).timestamp())

    def ticks_between(self, after: float, until: float, *, limit: int) -> list[int]:
        """Up to `limit` latest ticks t with after < t <= until, oldest first."""
        out: list[int] = []
        t = self.last_tick(until)
        while t > after and len(out) < limit:
            out.append(t)
            t = self.last_tick(t - 1)
        out.reverse()
        return out

    def job_id(self, tick: int) -> str:
        """The id of this schedule's job for `tick`: `sched.<name>.<epoch>` (hashed if long)."""
        job_id = f"sched.{self.key}.{tick}"
        if JOB_ID_RE.fullmatch(job_id):
            return job_id
        digest = hashlib.sha256(self.key.encode()).hexdigest()[:12]
        return f"sched.{self.key[:80]}-{digest}.{tick}"

    def _on_time(self, tick: int, now: float) -> bool:
        # A worker wakes for a tick a little after it, never exactly at it: with a grace
        # below that (0), a "skip" schedule never fired at all.
        return now - tick <= max(self.grace_seconds, WAKE_SLACK_SECONDS)

    @property
    def rule_id(self) -> int:
        """A fingerprint of the rule (cron and zone, or interval), kept beside the mark: a
        rule changed under the same name is told by it (`plan`'s `rule_changed`). Two
        spellings of one cron rule (`0  3 * * *`, `0 3 * * 0-6`, Sunday as 7) share it."""
        return self._rule_id

    def same_rule(self, rule_id: int) -> bool:
        """Whether a fingerprint kept beside the mark is this schedule's rule; also the one
        versions before 12-05 kept (of the cron text as written), so an upgrade is no
        rule change."""
        return rule_id == self.rule_id or (
            self.cron is not None and rule_id == fingerprint(f"cron {self._expr} {self.tz}"))

    def plan(self, last: int | None, now: float, *,
             rule_changed: bool | None = None) -> tuple[list[int], int]:
        """The ticks to fire at `now` given the last tick fired, and the new last tick.
        `rule_changed`: the mark was left by another rule under this schedule's name (True),
        by this rule (False), or by a version that kept no fingerprint (None: told by the
        mark being no tick of this rule)."""
        latest = self.last_tick(now)
        if last is not None and last > now + CLOCK_JUMP_SECONDS:
            # The last tick fired is far in the future: the clock was wrong and came back.
            # Kept, it would silence the schedule until the clock caught up with it (a year,
            # after a one-year mistake). Start over as at first sight; a tick the wrong
            # clock fired fires again if its job was pruned since (its id is free again).
            log.error("schedule %s: its last tick fired (%s) is %.0f s ahead of this clock, "
                      "more than %.0f s: taken for a clock that was wrong; starting over "
                      "(ticks that clock fired may fire again)", self.key,
                      _iso(last), last - now, CLOCK_JUMP_SECONDS)
            last = None
        elif last is not None and last > now + 60 and self._due_to_log(now):
            log.warning("schedule %s: its last tick fired (%s) is %.0f s ahead of this clock "
                        "(the clock stepped back, or the one that fired it runs ahead); the "
                        "ticks up to it fired already, so none fires until this clock "
                        "passes it", self.key, _iso(last), last - now)
        floor: int | None = None
        if last is not None and (rule_changed or (rule_changed is None
                                                  and self.last_tick(last) != last)):
            # The rule changed under its name (every 3600 s became every 60 s): known by
            # the fingerprint kept beside the mark, or, for a mark from before fingerprints,
            # by the mark being no tick of this rule (which misses a mark that is a tick of
            # both: a whole hour, for every 60 s). Caught up from the old mark, the new rule fired each of
            # its ticks since (100 jobs at once with "all"): start over as at first sight,
            # but never at or before that mark. Two rules live at once (a rolling deploy)
            # otherwise fired a tick again, its first job already pruned: each took the
            # other's mark for a rule change and re-fired its own latest tick. That floor
            # is then kept as this rule's mark, under its fingerprint: a mark that is no
            # tick of this rule is no rule change once the fingerprint says it is this one
            # (else "all" lost each tick missed after it, firing only the latest).
            floor, last = last, None
        if last is None:
            if floor is not None and self.catch_up != "skip" and latest > floor:
                # The rule changed while the workers were down: a catch-up schedule still
                # owes the downtime a run, but only one (its ticks before it existed are
                # not missed ones, and "all" would fire a burst of them).
                return [latest], latest
            # First sight: the tick that is happening right now counts, older ones do not.
            fire = self._on_time(latest, now) and (floor is None or latest > floor)
            return ([latest] if fire else []), (latest if floor is None else max(latest, floor))
        if latest <= last:
            return [], last
        if self.catch_up == "all":
            ticks = self.ticks_between(last, now, limit=self.max_catch_up)
            if len(ticks) == self.max_catch_up and self.last_tick(ticks[0] - 1) > last:
                log.warning("schedule %s: more than max_catch_up=%d ticks were missed since "
                            "%s; firing the latest %d, from %s (the older ones are skipped)",
                            self.key, self.max_catch_up, _iso(last), len(ticks),
                            _iso(ticks[0]))
            return ticks, latest
        if self.catch_up == "once" or self._on_time(latest, now):
            return [latest], latest
        return [], latest  # skip: the latest tick is late too


def _zone(name: object, label: str) -> tzinfo:
    if name == "UTC":
        return UTC
    if not isinstance(name, str):
        raise ScheduleError(f"{label}: time zone must be an IANA name such as 'Europe/Paris', "
                            f"got {name!r}")
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(name)
    except (ValueError, LookupError) as exc:
        raise ScheduleError(f"{label}: unknown time zone {name!r} ({exc})") from None


_YEAR_10000 = 253_402_300_800.0  # 10000-01-01T00:00:00Z: the bound of every stored time
_MAX_EVERY = 100 * 365 * 86_400  # past this a tick lands beyond the year 9999 bound


def _every_seconds(every: object, label: str) -> int:
    value: object = every.total_seconds() if isinstance(every, timedelta) else every
    # The bounds first: math.isfinite(10**400) (or of -10**400) raised OverflowError.
    if isinstance(value, bool) or not isinstance(value, int | float) or value > _MAX_EVERY \
            or value < 1 or not math.isfinite(value) or value != int(value):
        shown = repr(every)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ScheduleError(f"{label}: every must be a whole number of seconds from 1 to "
                            f"{_MAX_EVERY} (100 years), got {shown}")
    return int(value)


def check_schedules(schedules: Iterable[Schedule] | None, kinds: Iterable[str], *,
                    where: str = "app") -> tuple[Schedule, ...]:
    """Refuse (`ScheduleError`) what is not a `Schedule`, a kind without a handler, a
    repeated name; return them as a tuple."""
    known = set(kinds)
    out: list[Schedule] = []
    seen: set[str] = set()
    if schedules is None:
        schedules = ()
    if isinstance(schedules, Schedule | str | bytes | Mapping) or \
            not isinstance(schedules, Iterable):
        raise ScheduleError(f"{where}: schedules must be a list of jobspool.Schedule objects, "
                            f"got {schedules!r}")
    for s in schedules:
        if not isinstance(s, Schedule):
            raise ScheduleError(f"{where}: schedules must be jobspool.Schedule objects, got {s!r}")
        if s.kind not in known:
            raise ScheduleError(f"{where}: schedule for kind {s.kind!r} has no handler "
                                f"(handlers: {', '.join(sorted(known)) or 'none'})")
        if s.key in seen:
            raise ScheduleError(f"{where}: two schedules named {s.key!r}; give one a name=")
        seen.add(s.key)
        out.append(s)
    return tuple(out)


def check_schedule_sizes(schedules: Iterable[Schedule], max_job_bytes: int, *,
                         where: str = "worker") -> None:
    """Refuse (`ScheduleError`) a schedule whose job the spool would refuse as too large:
    its payload is fixed, so it would never fire, only warn at every attempt."""
    from jobspool.queue.jobsize import encode_admitted
    from jobspool.queue.machine import new_job

    for s in schedules:
        job = new_job(job_id=s.job_id(9_999_999_999), kind=s.kind, payload=s.payload, now=0.0, delay=0.0,
                      priority=s.priority, max_attempts=1)
        try:
            encode_admitted(job, max_bytes=max_job_bytes)
        except JobspoolError as exc:
            raise ScheduleError(f"{where}: schedule {s.key!r} can never fire: {exc}") from None


# ---------------------------------------------------------------- firing


@dataclass(frozen=True, slots=True)
class Fired:
    """What one `Scheduler.tick` did for one schedule."""

    schedule: str
    ticks: tuple[int, ...]  # ticks fired (jobs enqueued or found already there)
    created: tuple[str, ...]  # job ids this call created


class Scheduler:
    """Fires due ticks of a set of schedules into a spool; `tick` is safe to call from
    any number of threads and processes at once (see the module docstring)."""

    def __init__(self, schedules: Sequence[Schedule]) -> None:
        if isinstance(schedules, Schedule | str | bytes | Mapping) or \
                not isinstance(schedules, Iterable):
            raise ScheduleError(f"Scheduler takes a list of jobspool.Schedule objects, got "
                                f"{schedules!r}")
        self.schedules = tuple(schedules)
        seen: set[str] = set()
        for s in self.schedules:
            if not isinstance(s, Schedule):
                raise ScheduleError(f"Scheduler takes jobspool.Schedule objects, got {s!r}")
            # One mark per name in the marks file: two schedules of one name shared it, as
            # `App` and `Worker` (`check_schedules`) refuse.
            if s.key in seen:
                raise ScheduleError(f"Scheduler: two schedules named {s.key!r}; give one a "
                                    "name=")
            seen.add(s.key)

    def tick(self, spool: Spool, now: float | None = None) -> list[Fired]:
        """Enqueue every tick due at `now` (default: the spool's clock) not fired yet.

        A schedule whose job the spool refuses (too large for `max_job_bytes`, or
        `Backpressure`) is logged and keeps its mark, so it is tried again at the next
        call; the other schedules fire regardless."""
        if not self.schedules:
            return []
        out: list[Fired] = []
        if now is not None and (isinstance(now, bool) or not isinstance(now, int | float)
                                or not 0 <= now < _YEAR_10000):
            raise ScheduleError(f"tick: now must be epoch seconds (a finite number from 0 "
                                f"to year 9999), got {now!r}")
        with spool.hold_schedule_marks() as marks:
            at = spool.now() if now is None else float(now)
            for s in self.schedules:
                rule = marks.get(s.key + RULE_MARK)
                ticks, last = s.plan(marks.get(s.key), at,
                                     rule_changed=None if rule is None else not s.same_rule(rule))
                created = []
                try:
                    for t in ticks:
                        result = spool.enqueue_result(s.kind, s.payload, job_id=s.job_id(t),
                                                      priority=s.priority)
                        if result.created:
                            created.append(result.job.id)
                except (InvalidJob, Backpressure) as exc:
                    # Ticks enqueued before the refusal are found by their ids next time.
                    log.warning("schedule %s not fired (retrying): %s", s.key, exc)
                    continue
                marks[s.key] = last
                marks[s.key + RULE_MARK] = s.rule_id
                if ticks:
                    out.append(Fired(s.key, tuple(ticks), tuple(created)))
        for f in out:
            if f.created:
                log.info("schedule %s fired %s", f.schedule, ", ".join(f.created))
        return out

    def next_wake(self, now: float) -> float:
        """Seconds until the earliest next tick of any schedule (at least 0)."""
        ticks = [t for t in (_next_tick(s, now) for s in self.schedules) if t is not None]
        return max(0.0, min(ticks) - now) if ticks else math.inf

    def status(self, spool: Spool, now: float | None = None) -> list[dict[str, Any]]:
        """Per schedule: name, kind, rule, catch-up, last tick and next tick (ISO too).

        The last tick is the latest one the schedule has passed: fired, or passed over
        by its catch-up rule or at first sight (None: none yet under its current rule).
        `last_job_state` tells them apart: the state of that tick's job, or None when
        there is none (not fired, or pruned)."""
        at = spool.now() if now is None else float(now)
        marks = spool.schedule_marks(rules=True)
        rows = []
        for s in self.schedules:
            last = marks.get(s.key)
            rule = marks.get(s.key + RULE_MARK)
            if last is not None and ((rule is not None and not s.same_rule(rule))
                                     or s.last_tick(last) != last):
                # The mark of the rule this name had before (`tick` starts over from it,
                # and keeps it as a floor under this rule's fingerprint when it is later
                # than this rule's latest tick): no tick of this one, and it was listed as
                # this rule's last.
                last = None
            nxt = _next_tick(s, at)
            state = None
            if last is not None:
                with contextlib.suppress(JobNotFound):  # passed over, or pruned since
                    state = spool.get(s.job_id(last)).state.value
            rows.append({"name": s.key, "kind": s.kind, "rule": s.describe(),
                         "catch_up": s.catch_up,
                         "last_tick": last, "last_tick_iso": None if last is None else iso_time(last),
                         "last_job_id": None if last is None else s.job_id(last),
                         "last_job_state": state,
                         "next_tick": nxt, "next_tick_iso": None if nxt is None else iso_time(nxt)})
        return rows


def _next_tick(schedule: Schedule, now: float) -> int | None:
    """`schedule.next_tick(now)`, None past the year 9999 (a clock set that far wrong must
    not stop the worker, nor `jobspool schedules`)."""
    try:
        return schedule.next_tick(now)
    except (OverflowError, ValueError, OSError):
        return None


class _Serving(Protocol):
    """What firing schedules needs of the worker that runs them."""

    @property
    def spool(self) -> Spool: ...

    @property
    def schedules(self) -> Sequence[Schedule]: ...

    @property
    def stopping(self) -> bool: ...


async def serve_schedules(worker: _Serving, *, max_sleep: float = 1.0) -> None:
    """Fire `worker.schedules` until the worker stops (started by `Worker.run_forever`).

    Wakes at the next tick or every `max_sleep` seconds, whichever is first, so
    a clock jump or a new tick is noticed within a second; a failed firing is
    logged and retried at the next wake, never fatal to the worker.
    """
    import anyio

    scheduler = Scheduler(worker.schedules)
    spool = worker.spool
    while not worker.stopping:
        try:
            await anyio.to_thread.run_sync(scheduler.tick, spool)
        except (OSError, JobspoolError) as exc:
            log.warning("firing schedules failed (retrying): %s", exc)
        await anyio.sleep(min(max_sleep, scheduler.next_wake(spool.now()) + 0.001))


__all__ = ["CATCH_UP", "Fired", "Schedule", "Scheduler", "check_schedules", "read_marks",
           "serve_schedules"]
