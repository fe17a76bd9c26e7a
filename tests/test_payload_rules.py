"""One payload rule for API and CLI (DESIGN §9): JSON-able payloads round-trip unchanged;
NaN, infinity and every other non-JSON value are refused, identically, naming the field."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobspool import Spool
from jobspool.errors import InvalidJob
from tests.cli_harness import run_cli
from tests.helpers_spool import FakeClock, job_files
from tests.spools import make_spool
from tests.strategies import json_values

# Values JSON text can spell (so the CLI can be handed them) that JSON cannot carry.
_bad_leaves = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.integers(min_value=2**64, max_value=2**80),
    st.integers(min_value=-(2**80), max_value=-(2**63) - 1),
    st.sampled_from(["\ud800", "a\udfffb"]),
)


@st.composite
def poisoned(draw: st.DrawFn) -> Any:
    """A JSON value with one bad leaf somewhere inside."""
    bad = draw(_bad_leaves)
    shape = draw(st.sampled_from(["leaf", "list", "dict", "deep"]))
    if shape == "leaf":
        return bad
    if shape == "list":
        items = draw(st.lists(json_values, max_size=3))
        items.insert(draw(st.integers(0, len(items))), bad)
        return items
    if shape == "dict":
        d = draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3))
        d[draw(st.text(max_size=5))] = bad
        return d
    return {"a": [1, {"b": [bad]}]}


def _one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def cli_root(spool_root: Path) -> str:
    assert run_cli("init", root=spool_root).code == 0
    return str(spool_root)


@given(payload=json_values)
def test_any_json_payload_round_trips_unchanged_through_enqueue_and_claim(
        spool: Spool, payload: Any) -> None:
    job = spool.enqueue("k", payload)
    assert spool.get(job.id).payload == payload
    (lease,) = spool.claim()
    assert lease.job.payload == payload
    spool.complete(lease, payload)
    assert spool.get(job.id).result == payload


@given(payload=json_values)
def test_any_json_payload_round_trips_unchanged_through_the_cli(
        cli_root: str, payload: Any) -> None:
    # From stdin: a negative number in exponent form would read as an option on argv.
    done = run_cli("enqueue", "k", "-", "--json", root=cli_root, stdin=json.dumps(payload))
    assert done.code == 0
    job_id = done.json()["id"]
    with make_spool(cli_root) as spool:
        assert spool.get(job_id).payload == payload


@given(payload=poisoned())
def test_every_non_json_value_is_refused_identically_by_api_and_cli(
        spool: Spool, spool_root: Path, cli_root: str, payload: Any) -> None:
    with pytest.raises(InvalidJob) as info:
        spool.enqueue("k", payload)
    assert info.value.field == "payload"
    message = str(info.value)
    assert message.startswith("payload") and "\n" not in message
    # json.dumps spells NaN, Infinity, huge integers and lone surrogates (as \\u escapes).
    captured = run_cli("enqueue", "k", "-", root=cli_root, stdin=json.dumps(payload))
    code = captured.code
    assert code == 1
    assert captured.err == f"jobspool: error: {_one_line(message)}\n"
    assert captured.out == ""
    assert job_files(spool_root) == {}


@pytest.mark.parametrize(("value", "named"), [
    (dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "datetime"),
    (dt.date(2026, 1, 1), "date"),
    (uuid.UUID(int=7), "UUID"),
    (b"raw", "bytes"),
    (bytearray(b"raw"), "bytearray"),
    ({1, 2}, "set"),
    (frozenset({1}), "frozenset"),
    (Decimal("1.5"), "Decimal"),
    (1 + 2j, "complex"),
    (object(), "object"),
])
def test_python_values_json_cannot_carry_are_refused_naming_the_field(
        spool: Spool, spool_root: Path, value: object, named: str) -> None:
    with pytest.raises(InvalidJob) as info:
        spool.enqueue("k", {"doc": {"when": [0, value]}})
    message = str(info.value)
    article = "an" if named == "object" else "a"
    assert message.startswith(f"payload['doc']['when'][1] is {article} " + named)
    assert info.value.field == "payload"
    with pytest.raises(InvalidJob, match=r"^payload\['x'\] is an? " + named):
        spool.prepare("k", {"x": value})
    assert job_files(spool_root) == {}


def test_a_non_string_key_is_refused_naming_where(spool: Spool) -> None:
    with pytest.raises(InvalidJob, match=r"payload\['a'\] is an object with a non-string key 1"):
        spool.enqueue("k", {"a": {1: "x"}})


def test_tuples_are_stored_as_lists_the_one_documented_conversion(spool: Spool) -> None:
    job = spool.enqueue("k", {"pair": (1, "a")})
    assert spool.get(job.id).payload == {"pair": [1, "a"]}


def test_a_nan_in_enqueue_many_refuses_the_whole_batch(spool: Spool, spool_root: Path) -> None:
    with pytest.raises(InvalidJob, match="nan"):
        spool.enqueue_many("k", [{"ok": 1}, {"x": math.nan}])
    assert job_files(spool_root) == {}


def test_a_handler_result_with_nan_is_an_error_not_a_null(spool: Spool) -> None:
    job = spool.enqueue("k", 1)
    (lease,) = spool.claim()
    with pytest.raises(InvalidJob) as info:
        spool.complete(lease, {"score": math.nan})
    assert info.value.field == "result" and "nan" in str(info.value)
    still = spool.get(job.id)
    assert still.state.value == "leased" and still.result is None


def test_a_worker_never_stores_a_handler_nan_as_null(spool: Spool) -> None:
    from jobspool import Worker

    job = spool.enqueue("k", 1, max_attempts=1)
    Worker(spool, {"k": lambda job, ctx: math.inf}, maintenance=False).run_until_idle()
    done = spool.get(job.id)
    assert done.state.value != "completed"
    assert done.result is None and "inf" in (done.last_error or "")


def test_an_async_handler_that_forgets_an_await_is_told_so(spool: Spool) -> None:
    from jobspool import Worker

    async def inner() -> str:
        return "inner"

    async def forgetful(job: object, ctx: object) -> object:
        coro = inner()
        coro.close()  # what it returns is the mistake; the test need not leak it
        return coro

    job = spool.enqueue("k", 1)
    Worker(spool, {"k": forgetful}, maintenance=False).run_until_idle()
    done = spool.get(job.id)
    assert done.state.value == "dead_letter"
    assert "coroutine" in (done.last_error or "") and "await" in (done.last_error or "")


@pytest.mark.parametrize(("run_at", "says"), [
    (math.nan, "finite"), (math.inf, "finite"), ("tomorrow", "epoch seconds"),
    (True, "epoch seconds"), (dt.datetime(2030, 1, 1), "naive"),
    (1_000.0, "in the past"), (1e13, "9999"),
])
def test_a_run_at_that_is_not_a_usable_time_is_refused_and_nothing_is_written(
        spool: Spool, spool_root: Path, run_at: object, says: str) -> None:
    with pytest.raises(InvalidJob, match=says) as info:
        spool.enqueue("k", 1, run_at=run_at)  # type: ignore[arg-type]
    assert info.value.field == "run_at"
    assert job_files(spool_root) == {}


def test_run_at_takes_epoch_seconds_or_an_aware_datetime(spool: Spool, clock: FakeClock) -> None:
    at = dt.datetime.fromtimestamp(clock.now + 90, dt.UTC)
    a = spool.enqueue("k", 1, run_at=at)
    b = spool.enqueue("k", 2, run_at=clock.now + 90)
    assert a.run_at == b.run_at == clock.now + 90
    assert (a.status, a.state.value) == ("scheduled", "retryable")
    assert spool.stats().scheduled == 2
    past = spool.enqueue("k", 3, run_at=clock.now - 60)
    assert past.state.value == "ready"
    with pytest.raises(InvalidJob, match="not both"):
        spool.enqueue("k", 4, run_at=clock.now + 5, delay=5)


@pytest.mark.parametrize(("text", "says"), [
    ("nan", "run_at must be a finite time, got nan"),
    ("inf", "run_at must be a finite time, got inf"),
    ("2030-01-01T00:00:00", "has no time zone: end it with Z (UTC) or an offset"),
    ("next tuesday", "--run-at 'next tuesday' is neither epoch seconds nor an ISO 8601 time"),
])
def test_cli_run_at_refusals_are_one_line_errors(
        cli_root: str, text: str, says: str) -> None:
    refused = run_cli("enqueue", "k", "--run-at", text, root=cli_root)
    assert refused.code == 1
    err = refused.err
    assert err.startswith("jobspool: error: ") and says in err and err.count("\n") == 1


def test_cli_run_at_accepts_iso_with_zone_and_epoch_and_shows_the_job_as_scheduled(
        cli_root: str) -> None:
    def ok(*args: str) -> str:
        done = run_cli(*args, root=cli_root)
        assert done.code == 0, done.err
        return done.out

    assert ok("enqueue", "k", "--id", "a", "--run-at",
              "2099-06-01T12:00:00+02:00").split() == ["a", "scheduled"]
    doc = json.loads(ok("enqueue", "k", "--id", "b", "--run-at", "4102444800", "--json"))
    assert (doc["state"], doc["status"], doc["run_at_iso"]) == (
        "retryable", "scheduled", "2100-01-01T00:00:00.000Z")
    listed = ok("list")
    assert "scheduled" in listed and "2099-06-01T10:00:00.000Z" in listed
    ok("enqueue", "k", "--id", "now")
    assert sorted(j["id"] for j in json.loads(ok("list", "--state", "scheduled", "--json"))) == [
        "a", "b"]
    shown = ok("show", "a")
    assert "scheduled" in shown and "2099-06-01T10:00:00.000Z" in shown
    assert json.loads(ok("stats", "--json"))["scheduled"] == 2


def test_wait_takes_any_real_number_and_refuses_one_past_floats_range(spool: Spool) -> None:
    # Found in a new-user pass: numpy's float64 was taken but its int64 refused, and
    # timeout=10**400 raised OverflowError instead of InvalidJob.
    from fractions import Fraction

    from jobspool.errors import WaitTimeout

    job = spool.enqueue("k")
    for timeout in (Fraction(1, 100), 0):
        with pytest.raises(WaitTimeout):
            spool.wait(job.id, timeout=timeout)
    with pytest.raises(InvalidJob, match="timeout must be a non-negative finite number"):
        spool.wait(job.id, timeout=10**400)


def test_a_refused_payload_of_a_batch_is_named_by_its_place(spool: Spool) -> None:
    # Found in a producers pass: the error named a generated id the caller never saw, or
    # "payload['a'] is nan" with no hint which of the batch.
    from jobspool.errors import JobTooLarge

    with pytest.raises(JobTooLarge, match=r"^payload 1 of the batch of 3: "):
        spool.enqueue_many("k", [1, "x" * 70_000, 3])
    with pytest.raises(InvalidJob, match=r"^payload 2 of the batch of 3: payload\['a'\] is nan"):
        spool.enqueue_many("k", [1, 2, {"a": math.nan}])
    assert list(spool.jobs()) == []


def test_subclasses_json_cannot_carry_are_refused_naming_the_place(spool: Spool) -> None:
    # Found in a producers pass: a NamedTuple or a float subclass passed the payload check
    # and orjson refused it with "Type is not JSON serializable: NT", naming no place.
    from typing import NamedTuple

    class Point(NamedTuple):
        x: int

    class Celsius(float):
        pass

    with pytest.raises(InvalidJob, match=r"^payload\['p'\] is a Point \(a tuple subclass"):
        spool.enqueue("k", {"p": Point(1)})
    with pytest.raises(InvalidJob, match=r"^payload\[0\] is a Celsius \(a float subclass"):
        spool.enqueue("k", [Celsius(1.5)])
    assert list(spool.jobs()) == []


def test_a_refusal_names_the_type_with_its_article() -> None:
    """'payload['o'] is a object' read wrong; CommitRetry is importable where the README
    points (`jobspool.projection`)."""
    from jobspool.projection import CommitRetry
    from jobspool.queue.payload import check_json

    with pytest.raises(InvalidJob, match=r"is an object, which JSON cannot carry"):
        check_json({"o": object()}, "payload")
    with pytest.raises(InvalidJob, match=r"is a set, which JSON"):
        check_json({"o": set()}, "payload")
    assert CommitRetry().attempts >= 1


def test_the_deepest_payload_refused_is_refused_with_its_path_and_one_less_is_stored(
        tmp_path: Path) -> None:
    """A payload sits one level down in its job's document: 254 levels passed the check
    and then failed at the write with orjson's bare 'Recursion limit reached'."""
    from jobspool.errors import InvalidJob
    from jobspool.queue.payload import MAX_JSON_DEPTH

    def nest(n: int) -> object:
        x: object = 1
        for _ in range(n):
            x = [x]
        return x

    with make_spool(tmp_path / "s") as spool:
        job = spool.enqueue("k", nest(MAX_JSON_DEPTH))
        assert spool.get(job.id).payload == nest(MAX_JSON_DEPTH)
        with pytest.raises(InvalidJob) as caught:
            spool.enqueue("k", nest(MAX_JSON_DEPTH + 1))
        assert "nested deeper than" in str(caught.value) and "[0][0]" in str(caught.value)


def test_a_str_subclass_key_is_refused_naming_where(tmp_path: Path) -> None:
    """orjson refuses a str subclass as a key with its bare "Dict key must be str"."""
    from jobspool.errors import InvalidJob

    class Name(str):
        pass

    with make_spool(tmp_path / "s") as spool, pytest.raises(InvalidJob) as caught:
        spool.enqueue("k", {"outer": {Name("k"): 1}})
    assert "outer" in str(caught.value) and "str(key)" in str(caught.value)


def test_int_and_str_subclass_values_are_refused_not_converted(tmp_path: Path) -> None:
    """An IntEnum or StrEnum member was stored as its number or text and read back a plain
    int or str: converted silently, where the rule says only a tuple is (a producers
    probe). Float subclasses were refused already."""
    import enum

    from jobspool.errors import InvalidJob

    class Color(enum.IntEnum):
        RED = 1

    class Mode(enum.StrEnum):
        FAST = "fast"

    with make_spool(tmp_path / "s") as spool:
        for value, says in [(Color.RED, "payload['c'] is a Color (an int subclass)"),
                            (Mode.FAST, "payload['c'] is a Mode (a str subclass)")]:
            with pytest.raises(InvalidJob, match=re.escape(says)):
                spool.enqueue("k", {"c": value})
        assert list(spool.jobs()) == []
        spool.enqueue("k", {"c": Color.RED.value, "m": Mode.FAST.value}, job_id="plain")
        assert spool.get("plain").payload == {"c": 1, "m": "fast"}
