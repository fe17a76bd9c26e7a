"""Cron expressions for `jobspool.Schedule`: the macros, the check (one-line errors) and
the canonical form a rule's fingerprint is taken of (parsing is cronsim's)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from jobspool.errors import ScheduleError

# The nicknames cron, croniter and Oban take (cronsim does not): what each stands for.
CRON_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
               "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
               "@hourly": "0 * * * *"}


def cron_check(expr: object, label: str) -> str:
    """The expression cronsim is given (a macro such as `@daily` expanded), checked."""
    from cronsim import CronSim, CronSimError

    if not isinstance(expr, str):
        raise ScheduleError(f"{label}: cron must be a string, got {expr!r}")
    if expr.strip().startswith("@") and expr.strip().lower() not in CRON_MACROS:
        raise ScheduleError(f"{label}: invalid cron expression {expr!r} (macros: "
                            f"{', '.join(CRON_MACROS)})")
    full = CRON_MACROS.get(expr.strip().lower(), expr.strip())
    if len(full.split()) != 5:
        # cronsim also takes a sixth (seconds) field: a tick a second would be a surprise.
        raise ScheduleError(f"{label}: invalid cron expression {expr!r} (five fields: minute "
                            f"hour day-of-month month day-of-week; got {len(full.split())})")
    try:
        next(CronSim(full, datetime(2000, 1, 1, tzinfo=UTC)))
    except (CronSimError, StopIteration) as exc:
        raise ScheduleError(f"{label}: invalid cron expression {expr!r} ({exc})") from None
    return full


def fingerprint(rule: str) -> int:
    return int.from_bytes(hashlib.sha256(rule.encode()).digest()[:8], "big") >> 1


def cron_canonical(expr: str) -> str:
    """The ticks a (checked) expression stands for, spelled one way: its fields as cronsim
    expands them, Sunday as 0, and a day-of-month OR day-of-week that matches every day
    as every day (`0 3 1-31 * 0-6` is `0 3 * * *`)."""
    from cronsim import CronSim

    c = CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    try:
        minutes, hours, months = c.minutes, c.hours, c.months
        days: set[Any] = set(c.days)
        weekdays: set[Any] = {_sunday(w) for w in c.weekdays}
        day_and = c.day_and
    except AttributeError:  # a cronsim without these: the text, spaced and cased one way
        return " ".join(expr.lower().split())
    every_day, every_weekday = set(range(1, 32)), set(range(7))
    all_days, all_weekdays = days >= every_day, weekdays >= every_weekday
    if (all_days and all_weekdays) or (not day_and and (all_days or all_weekdays)):
        days, weekdays, day_and = every_day, every_weekday, True
    elif all_days:
        days = every_day  # ANDed with the weekdays: they alone decide
    parts = [sorted(minutes), sorted(hours), sorted(days, key=repr), sorted(months),
             sorted(weekdays, key=repr), day_and]
    return repr(parts)


def _sunday(weekday: Any) -> Any:
    if weekday == 7:
        return 0
    if isinstance(weekday, tuple) and weekday and weekday[0] == 7:
        return (0, *weekday[1:])
    return weekday


__all__ = ["CRON_MACROS", "cron_canonical", "cron_check", "fingerprint"]
