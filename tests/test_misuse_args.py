"""Arguments a caller gets wrong are refused at the call, in one line naming them.

Before: `fail(retryable="false")` retried (a str is truthy), `Spool(durable="false")`
kept every flush, `claim(kinds=5)` and friends raised "'int' object is not iterable"
from deep inside, a worker's `owner` with a newline or a surrogate failed at its first
claim or in its metrics file, `max_crashes="5"` at its first failure, a
`crash_window_seconds` of NaN never gave up, and a handler that cannot take
`(job, ctx)` failed every job of its kind, attempt after attempt.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from jobspool import JobState, Spool, Worker
from jobspool.errors import ConfigError, InvalidJob, JobspoolError


def _one_line(exc: BaseException, *names: str) -> None:
    text = str(exc)
    assert "\n" not in text
    for name in names:
        assert name in text, (name, text)


@pytest.mark.parametrize("value", ["false", 0, 1, None])
def test_fail_takes_only_a_real_bool_for_retryable(spool: Spool, value: Any) -> None:
    spool.enqueue("k", job_id="j1")
    (lease,) = spool.claim()
    with pytest.raises(InvalidJob) as caught:
        spool.fail(lease, "boom", retryable=value)
    _one_line(caught.value, "retryable")
    with pytest.raises(InvalidJob):
        spool.fail_many([(lease, "boom", value, None)])
    assert spool.get("j1").state is JobState.LEASED  # nothing was recorded
    assert spool.fail(lease, "boom", retryable=False).state is JobState.DEAD_LETTER


@pytest.mark.parametrize("option", ["create", "durable", "read_only"])
def test_spool_flags_take_only_a_real_bool(tmp_path: Path, option: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        Spool(tmp_path / "s", **{option: "no"})
    _one_line(caught.value, option)
    assert not (tmp_path / "s").exists()  # refused before anything was made


@pytest.mark.parametrize("call", [
    lambda s: s.claim(kinds=5),
    lambda s: s.enqueue_many("k", 5),
    lambda s: s.cancel_matching(states=5),
    lambda s: s.requeue_matching(states=5),
])
def test_a_list_argument_given_a_number_is_refused_in_one_line(spool: Spool, call: Any) -> None:
    with pytest.raises(InvalidJob) as caught:
        call(spool)
    assert isinstance(caught.value, TypeError)  # and a TypeError, as Python's own would be
    _one_line(caught.value, "must be a list")
    assert "not iterable" not in str(caught.value)


def _handler(job: Any, ctx: Any) -> None:
    return None


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"owner": "bad\nowner"}, "owner"),
    ({"owner": "\ud800"}, "owner"),
    ({"owner": 5}, "owner"),
    ({"owner": "x" * 10_000}, "owner"),
    ({"max_crashes": "5"}, "max_crashes"),
    ({"max_crashes": 0}, "max_crashes"),
    ({"max_crashes": -1}, "max_crashes"),
    ({"crash_window_seconds": float("nan")}, "crash_window_seconds"),
    ({"crash_window_seconds": 0}, "crash_window_seconds"),
    ({"kinds": 5}, "kinds"),
    ({"keys": 5}, "keys"),
    ({"maintenance": "no"}, "maintenance"),
])
def test_worker_options_are_checked_at_construction(spool: Spool, kwargs: dict[str, Any],
                                                     named: str) -> None:
    with pytest.raises(JobspoolError) as caught:
        Worker(spool, {"k": _handler}, **kwargs)
    _one_line(caught.value, named)


@pytest.mark.parametrize("fn", [
    lambda job: None,
    lambda: None,
    lambda job, ctx, extra: None,
])
def test_a_handler_that_cannot_take_job_and_ctx_is_refused_at_start(spool: Spool,
                                                                     fn: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        Worker(spool, {"k": fn})
    _one_line(caught.value, "'k'", "(job, ctx)")


def _gen(job: Any, ctx: Any) -> Any:
    yield job


async def _agen(job: Any, ctx: Any) -> Any:
    yield job


class _GenCallable:
    def __call__(self, job: Any, ctx: Any) -> Any:
        yield job


@pytest.mark.parametrize("fn", [_gen, _agen, _GenCallable(), functools.partial(_gen)])
def test_a_generator_handler_is_refused_at_start(spool: Spool, fn: Any) -> None:
    # Found probing the handler runtime: a `yield` left in a handler was accepted, then
    # each job of its kind was dead-lettered without the handler's body ever running.
    spool.enqueue("k", job_id="j")
    with pytest.raises(ConfigError) as caught:
        Worker(spool, {"k": fn})
    _one_line(caught.value, "'k'", "generator", "yield")
    assert spool.get("j").state is JobState.READY


@pytest.mark.parametrize("fn", [
    lambda job, ctx: None,
    lambda job, ctx, extra=1: None,
    lambda *args: None,
    lambda job, *rest, **kw: None,
])
def test_handlers_that_can_take_job_and_ctx_are_accepted(spool: Spool, fn: Any) -> None:
    spool.enqueue("k")
    assert Worker(spool, {"k": fn}).run_until_idle().completed == 1


def test_a_worker_given_one_kind_as_a_string_claims_that_kind(spool: Spool) -> None:
    spool.enqueue("k")
    spool.enqueue("other")
    report = Worker(spool, {"k": _handler, "other": _handler}, kinds="k").run_until_idle()
    assert report.completed == 1
    assert {j.kind: j.state for j in spool.jobs()} == {"k": JobState.COMPLETED,
                                                       "other": JobState.READY}


@pytest.mark.parametrize("root", ["", " ", "\t", " spool", "spool ",
                                  " postgresql://u:S3CRET@127.0.0.1:1/db"])
def test_a_blank_or_padded_spool_root_is_refused_and_nothing_is_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: str) -> None:
    """`Spool("")` opened the working directory as a spool, `Spool(" ")` made one named " "."""
    from jobspool.errors import SpoolError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpoolError) as caught:
        Spool(root)
    _one_line(caught.value, "spool root")
    assert "S3CRET" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []
