"""`Retry(delay=...)` is checked where it is made, as `fail(delay=...)` is (DESIGN §9:
NaN and infinity refused by the API). Checked only at the settle, a bad delay was
dropped for the normal backoff, with a note in the job's last_error."""

from __future__ import annotations

import math
from typing import Any

import pytest

from jobspool import Retry, Spool, Worker
from jobspool.errors import InvalidJob
from tests.spools import SpoolFactory


@pytest.mark.parametrize("delay", [math.nan, math.inf, -1.0, "5", True, 1e300])
def test_a_bad_delay_is_refused_when_the_retry_is_made(delay: Any) -> None:
    with pytest.raises(InvalidJob, match=r"Retry\(delay=\.\.\.\)"):
        Retry("later", delay=delay)


@pytest.mark.parametrize("delay, expected", [(None, None), (0, 0.0), (2.5, 2.5), (7, 7.0)])
def test_a_good_delay_is_kept(delay: Any, expected: Any) -> None:
    assert Retry("later", delay=delay).delay == expected


def test_a_handler_raising_a_bad_retry_fails_its_job_naming_the_delay(
        make_spool: SpoolFactory) -> None:
    spool: Spool = make_spool()
    job = spool.enqueue("k", 1)

    def handler(job: Any, ctx: Any) -> None:
        raise Retry("later", delay=math.nan)

    Worker(spool, handlers={"k": handler}).run_until_idle()
    got = spool.get(job.id)
    assert got.state.value == "retryable"
    assert got.last_error is not None and "Retry(delay=...)" in got.last_error
    assert "nan" in got.last_error


def test_a_bad_retry_delay_is_retried_whatever_the_kind_s_retry_on(
        make_spool: SpoolFactory) -> None:
    """The handler asked for a retry: a computed delay a little below zero dead-lettered
    the job at its first attempt when the kind's policy lists what to retry."""
    from jobspool import Policy

    spool: Spool = make_spool()
    job = spool.enqueue("k", 1)

    def handler(job: Any, ctx: Any) -> None:
        raise Retry("later", delay=-5)

    Worker(spool, handlers={"k": handler},
           policies={"k": Policy(retry_on=(ConnectionError,))}).run_until_idle()
    got = spool.get(job.id)
    assert got.state.value == "retryable", got.last_error
    assert got.last_error is not None and "Retry(delay=...)" in got.last_error
