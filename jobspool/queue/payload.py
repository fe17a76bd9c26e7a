"""The one payload rule, and the time and number checks every boundary shares (API, CLI, results).

Split from `job.py` (which re-exports these names): what a value must be for
JSON to carry it unchanged, and how a `run_at` is validated and shown.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

import orjson

from jobspool.errors import InvalidJob

# ---------------------------------------------------------------- payload rule
#
# One rule for every value jobspool stores as JSON (payloads at enqueue/prepare, from
# the API and the CLI alike, and handler results): JSON's own types only, so that what
# a handler reads back is exactly what the producer gave. `None`, `bool`, `str`
# (valid UTF-8), `int` (orjson's range, -2**63 .. 2**64-1), finite `float`, `list`,
# `tuple` (stored as a list: the one conversion) and `dict` with `str` keys. Anything
# else — NaN, infinity, datetimes, UUIDs, bytes, sets, dataclasses — is refused with
# `InvalidJob` naming where it sits (`payload['when']`), never silently converted:
# orjson would turn NaN into null and a datetime into a string, and the handler
# would receive something the producer never sent.

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
# orjson refuses nesting deeper than 254 levels, and a payload or result sits one level
# down in its job's document: 253 is as deep as a value can go (254 failed later, at the
# write, with orjson's own message and no path).
MAX_JSON_DEPTH = 253
_JSON_NAMES = frozenset({"bool", "int", "float", "str", "list", "dict", "tuple"})
_HINTS = {
    "datetime": "use .isoformat() or a timestamp",
    "date": "use .isoformat()",
    "time": "use .isoformat()",
    "UUID": "use str(uuid)",
    "bytes": "use base64 or .hex()",
    "bytearray": "use base64 or .hex()",
    "set": "use a sorted list",
    "frozenset": "use a sorted list",
    "Decimal": "use str() or float()",
    "coroutine": "a missing `await`?",
}


def may_nest_deeper_than(text: bytes | str, limit: int) -> bool:
    if isinstance(text, str):
        return text.count("[") + text.count("{") > limit
    return text.count(b"[") + text.count(b"{") > limit


def nested_deeper_than(text: bytes | str, value: Any, limit: int) -> bool:
    """Whether `value`, parsed from `text`, nests containers more than `limit` deep.

    For readers: orjson parses deeper documents than it writes (about 1,024 levels
    against 254), so a hand-made file or row between the two read as a job that no
    transition could write back (every claim of it failed, and its batch mates with it).
    The openers in `text` bound the depth: most documents cost two `count`s
    (`may_nest_deeper_than`), and `value` may be a function that parses `text`, called
    only past that bound."""
    if not may_nest_deeper_than(text, limit):
        return False
    if callable(value):
        value = value()
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


class _NotJson(Exception):
    def __init__(self, path: list[object], what: str) -> None:
        super().__init__(what)
        self.path = path
        self.what = what


def check_json(value: object, where: str = "payload") -> None:
    """Refuse (`InvalidJob`, field `where`) a value JSON cannot carry unchanged.

    The message names the place, e.g. `payload['when'][0] is a datetime, which
    JSON cannot carry (use .isoformat() or a timestamp)`.
    """
    path: list[object] = []
    try:
        _check(value, path)
    except _NotJson as exc:
        steps = [f"[{p!r:.40}]" for p in exc.path]
        if len(steps) > 8:  # 253 levels of [0] made an 830-character line
            steps[4:-3] = [f"...({len(steps) - 7} levels)..."]
        raise InvalidJob(f"{where}{''.join(steps)} is {exc.what}", field=where) from None
    except RecursionError:
        raise InvalidJob(f"{where} is nested too deeply for JSON", field=where) from None


def json_snapshot(value: Any) -> Any:
    """A checked payload as every reader of the job file gets it: the returned `Job` kept
    the caller's own dict (so it changed when the caller reused it) and its tuples, and
    did not equal `get()` of the same job. A scalar is its own snapshot."""
    if value is None or type(value) in _SCALARS:
        return value
    return orjson.loads(orjson.dumps(value))


_SCALARS = (str, int, float, bool)


def _plain(value: object) -> bool:
    """Whether `value` is a scalar `_check` passes without a word (None, a bool, an ASCII
    str, an int in range, a finite float): the items of a container are mostly such, and
    asked here first, they skip `_check`'s chain of isinstance tests and the path
    bookkeeping (a payload of two plain fields: five calls of `_check` down to one). Exact
    types only: a subclass takes the full check."""
    if type(value) is str:
        return value.isascii()
    if type(value) is int:
        return _INT_MIN <= value <= _INT_MAX
    if type(value) is float:
        return math.isfinite(value)
    return value is None or type(value) is bool


def _check(value: object, path: list[object]) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if type(value) is not str:  # a StrEnum member: stored as its text, read back a str
            raise _NotJson(path, f"a {type(value).__name__} (a str subclass), which JSON "
                                 "cannot carry unchanged (an enum member: give its .value; "
                                 "any other: str(...))")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _NotJson(path, "a string with a lone surrogate, which is not valid "
                                     "UTF-8") from None
        return
    if isinstance(value, int):
        if type(value) is not int:  # an IntEnum member: stored as its number, read back an int
            raise _NotJson(path, f"a {type(value).__name__} (an int subclass), which JSON "
                                 "cannot carry unchanged (an enum member: give its .value; "
                                 "any other: int(...))")
        if not _INT_MIN <= value <= _INT_MAX:
            raise _NotJson(path, "an integer outside the 64-bit range JSON readers support")
        return
    if isinstance(value, float):
        if type(value) is not float:  # numpy.float64 and the like: orjson refuses them
            raise _NotJson(path, f"a {type(value).__name__} (a float subclass), which JSON "
                                 "cannot carry (use float(...))")
        if not math.isfinite(value):
            raise _NotJson(path, f"{value!r}, which JSON cannot carry (no NaN or infinity)")
        return
    if len(path) >= MAX_JSON_DEPTH:
        raise _NotJson(path, f"nested deeper than {MAX_JSON_DEPTH} levels, which JSON "
                             "readers refuse")
    if isinstance(value, tuple) and type(value) is not tuple:
        raise _NotJson(path, f"a {type(value).__name__} (a tuple subclass, e.g. a NamedTuple), "
                             "which JSON cannot carry (use tuple(...) or ._asdict())")
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if _plain(item):
                continue
            path.append(i)
            _check(item, path)
            path.pop()
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _NotJson(path, f"an object with a non-string key {key!r}, which JSON "
                                     "cannot carry")
            if type(key) is not str:  # a str subclass as a value is fine; orjson refuses keys
                raise _NotJson(path, f"an object with a key of type {type(key).__name__} (a "
                                     f"str subclass), which JSON cannot carry as a key "
                                     f"(use str(key))")
            if key.isascii() and _plain(item):
                continue
            path.append(key)
            _check(key, path)
            _check(item, path)
            path.pop()
        return
    kind = type(value)
    name = kind.__name__
    hint = _HINTS.get(name)
    # Qualified when the bare name is a type JSON carries: numpy.bool_ calls itself "bool".
    shown = (f"{kind.__module__}.{kind.__qualname__}" if name in _JSON_NAMES
             and kind.__module__ != "builtins" else name)
    # "an object", but "a UUID" (an acronym said letter by letter, from "you").
    article = "an" if shown[:1] in "aeiouAEIO" else "a"
    raise _NotJson(path, f"{article} {shown}, which JSON cannot carry"
                         + (f" ({hint})" if hint else ""))


def validate_run_at(run_at: object, now: float) -> float:
    """`run_at` as epoch seconds: a finite number or an aware `datetime`.

    Refused: a naive datetime (its zone is a guess), NaN/infinity, a time more
    than `MAX_RUN_AT_PAST` seconds before `now` (a unit or clock mistake, not a
    job to run at once) and one past year 9999 (milliseconds given as seconds).
    """
    import datetime as _dt

    if isinstance(run_at, _dt.datetime):
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidJob(f"run_at {run_at.isoformat()!r} is a naive datetime; give an aware "
                             "one (e.g. tzinfo=timezone.utc) or epoch seconds", field="run_at")
        value = run_at.timestamp()
        shown = repr(run_at.isoformat())  # what the caller wrote, not datetime.datetime(...)
    elif isinstance(run_at, bool) or not isinstance(run_at, int | float):
        raise InvalidJob(f"run_at must be epoch seconds or an aware datetime, got {run_at!r}",
                         field="run_at")
    else:
        shown = repr(run_at)
        if len(shown) > 40:  # a 400-digit int said whole in the message
            shown = shown[:37] + "..."
        try:
            value = float(run_at)
        except OverflowError:  # an int past any float: past the year 9999 (or before 1 AD)
            value = MAX_RUN_AT * 2 if run_at > 0 else -MAX_RUN_AT * 2
    if not math.isfinite(value):
        raise InvalidJob(f"run_at must be a finite time, got {run_at!r}", field="run_at")
    if MAX_RUN_AT < value < MAX_RUN_AT + 1 or (
            value == MAX_RUN_AT + 1 and isinstance(run_at, _dt.datetime)):
        # Within the last second of the year 9999: the latest time stored. A datetime
        # cannot be past it (23:59:59.999999 rounds up to the next second as a float);
        # the number 253402300800 is 10000-01-01T00:00:00Z, refused below.
        value = MAX_RUN_AT
    if value > MAX_RUN_AT:
        raise InvalidJob(f"run_at {shown} is past the year 9999 (milliseconds instead of "
                         "seconds?)", field="run_at")
    if value < now - MAX_RUN_AT_PAST:
        raise InvalidJob(f"run_at {shown} is more than {MAX_RUN_AT_PAST / 86400:.0f} days in "
                         "the past", field="run_at")
    return value


# A job file is read whole into memory by every reader, and its JSON parsed at once: a
# setting of a terabyte was accepted and saved. 64 MiB is far past any job worth queuing.
MAX_JOB_BYTES_LIMIT = 64 * 1024 * 1024
MAX_RUN_AT = 253402300799.0  # 9999-12-31T23:59:59Z
# The shortest time limit a job may have: below it the limit passed before the handler
# could start, every time, and `run-until-idle` claimed and gave the job back for ever.
MIN_TIMEOUT = 0.001
# The shortest lease a worker takes (a raw `claim` may take any): a worker must start each
# job and beat its lease within it; on PostgreSQL a 1e-6 s lease kept `run-until-idle`
# claiming one job for ever, each lease lost before its handler could start.
MIN_WORKER_LEASE = 0.01
MAX_RUN_AT_PAST = 7 * 86400.0


# ---------------------------------------------------------------- numbers
# (re-exported by job.py, where callers import them from)


def validate_int(name: str, value: object, *, minimum: int | None = None,
                 maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(f"{name} must be an integer, got {value!r}", field=name)
    if minimum is not None and value < minimum:
        raise InvalidJob(f"{name} must be >= {minimum}, got {value!r}", field=name)
    if maximum is not None and value > maximum:
        raise InvalidJob(f"{name} must be <= {maximum}, got {value!r}", field=name)
    if not -(1 << 63) <= value < (1 << 63):
        # Stored as JSON for orjson and as bigint in PostgreSQL: both stop at 64 bits.
        raise InvalidJob(f"{name} must fit in a signed 64-bit integer, got {value!r}",
                         field=name)
    return value


def validate_delay(value: object, name: str = "delay") -> float:
    """A delay: seconds from now, finite, non-negative, and not past the year 9999 (the
    bound `run_at` has: a delay in milliseconds, or a sentinel like 1e300, is a mistake)."""
    v = validate_seconds(name, value)
    if time.time() + v > MAX_RUN_AT:
        raise InvalidJob(f"{name} {value!r} s would run the job after the year 9999 (was it "
                         "given in milliseconds?)", field=name)
    return v


def validate_seconds(name: str, value: object, *, positive: bool = False) -> float:
    # numbers.Real: numpy's integers and floats, Fraction (never bool, a common slip).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidJob(f"{name} must be a number of seconds, got {value!r}", field=name)
    try:
        v = float(value)
    except OverflowError:  # an int past float's range (10**400)
        v = math.inf
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        need = "a positive" if positive else "a non-negative"
        raise InvalidJob(f"{name} must be {need} finite number, got {value!r}", field=name)
    if name in _WRITTEN_AS_TIMES and time.time() + v > MAX_RUN_AT:
        # A lease's expiry and a retry's due time are written into the job: past the year
        # 9999 no reader would take it (a backoff of 1e12 s made every failed job unreadable).
        raise InvalidJob(f"{name} {value!r} would {_WRITTEN_AS_TIMES[name]} after the year "
                         "9999 (was it given in milliseconds?)", field=name)
    return v


_WRITTEN_AS_TIMES = {"lease_seconds": "end the lease", "retry_base_seconds": "retry a job",
                     "retry_max_seconds": "retry a job"}


def iso_time(epoch: float) -> str:
    """Epoch seconds as ISO 8601 in UTC, to the millisecond (`2026-12-01T15:21:35.123Z`)."""
    import datetime as _dt

    try:
        t = _dt.datetime.fromtimestamp(epoch, _dt.UTC)
    except (OverflowError, OSError, ValueError):
        return repr(epoch)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")
