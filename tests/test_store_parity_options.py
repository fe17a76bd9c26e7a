"""The same calls, the same answers on both stores (a parity probe, 2026-12-04).

Before: on PostgreSQL an error holding NUL was stored past the 1,024-character limit
(each NUL became the 4-character escape `\\x00` after the cut), `Spool(url, create="no")`
opened and created the schema, `read_only="yes"` met a raw SQL error, bad `sync_mode`
and `access` values were ignored, `with spool:` entered a closed spool silently and
pickling it said "cannot pickle '_thread.lock' object". On the file store, `fail` on a
job near `max_job_bytes` returned an error that `get` did not show (the one stored was
cut to fit). Now both stores store NUL as U+2400, check every option the same way, and
return the job as stored.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobspool import Spool
from jobspool.errors import JobspoolError, SpoolClosed
from jobspool.queue.job import MAX_ERROR_CHARS, NUL_SHOWN
from tests.spools import make_spool


@pytest.mark.parametrize("error", ["\x00" * 5000, "x" * 1020 + "\x00" * 10, "a\x00b"])
def test_an_error_holding_nul_is_stored_within_the_limit_as_the_same_text(
        make_any_spool: Callable[..., Spool], error: str) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    spool.enqueue("k", job_id="j1")
    (lease,) = spool.claim()
    failed = spool.fail(lease, error)
    stored = spool.get("j1")
    assert failed.last_error == stored.last_error
    assert stored.last_error is not None and len(stored.last_error) <= MAX_ERROR_CHARS
    assert "\x00" not in stored.last_error and "\\x00" not in stored.last_error
    assert stored.last_error.startswith(error[:3].replace("\x00", NUL_SHOWN))


def test_the_failure_of_a_job_near_the_size_limit_is_returned_as_stored(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    spool.enqueue("k", {"big": "x" * 63_000}, job_id="j1")
    (lease,) = spool.claim()
    failed = spool.fail(lease, ValueError("\x00" * 3000))
    assert failed.last_error == spool.get("j1").last_error
    assert (failed.last_error or "").startswith("ValueError")


@pytest.mark.parametrize(("option", "value"), [
    ("create", "no"), ("read_only", "yes"), ("durable", "false"), ("sync_mode", "bogus"),
    ("access", "bogus"),
])
def test_a_bad_option_is_refused_alike_before_anything_is_made(
        store_root: str | Path, option: str, value: Any) -> None:
    with pytest.raises(JobspoolError) as caught:
        make_spool(store_root, **{option: value})
    assert option in str(caught.value) or repr(value) in str(caught.value)
    assert "\n" not in str(caught.value)
    assert "relation" not in str(caught.value)  # no SQL leaking out


def test_a_closed_spool_refuses_with_and_pickling_says_what_to_do(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(spool)
    spool.close()
    with pytest.raises(SpoolClosed), spool:
        pass
