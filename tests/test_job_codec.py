"""The job file codec: round trips, and every malformed file reported as CorruptJob, never a crash."""

from __future__ import annotations

import contextlib
import pickle
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobspool.errors import (
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    JobspoolError,
    JobTooLarge,
    LeaseLost,
    SpoolError,
)
from jobspool.queue.ids import new_job_id
from jobspool.queue.job import CorruptJob, Job, LeaseInfo, decode_job, encode_job
from jobspool.queue.states import JobState
from tests.strategies import jobs


def _job(**over: Any) -> Job:
    base: dict[str, Any] = dict(
        id="j1",
        kind="note",
        payload={"a": 1},
        state=JobState.READY,
        priority=0,
        attempts=0,
        max_attempts=5,
        revision=1,
        created_at=1.0,
        updated_at=1.0,
        run_at=1.0,
    )
    base.update(over)
    return Job(**base)


@given(jobs())
def test_encode_then_decode_returns_the_same_job(job: Job) -> None:
    data = encode_job(job, max_bytes=10**9)
    assert decode_job(data) == job
    assert decode_job(data, expect_id=job.id, expect_state=job.state) == job


@given(jobs())
def test_encoded_job_carries_a_format_version_and_its_state_name(job: Job) -> None:
    raw = orjson.loads(encode_job(job, max_bytes=10**9))
    assert raw["id"] == job.id
    assert raw["state"] == job.state.value
    assert any(k in raw for k in ("v", "version", "format")), "job file has no format version"


@given(st.binary(max_size=200))
def test_decode_of_arbitrary_bytes_raises_only_corrupt_job(data: bytes) -> None:
    with contextlib.suppress(CorruptJob):
        decode_job(data)


@given(jobs(), st.sampled_from(["id", "kind", "state", "priority", "attempts", "max_attempts",
                                "revision", "created_at", "updated_at", "run_at"]),
       st.sampled_from([None, "x", 1.5, [], {}, True]))
def test_decode_refuses_a_field_of_the_wrong_type(job: Job, field: str, bad: Any) -> None:
    raw = orjson.loads(encode_job(job, max_bytes=10**9))
    original = raw[field]
    if type(bad) is type(original) and field != "state":
        return  # "x" is a valid id and kind, 1.5 a valid time: not a wrong type
    if field in ("created_at", "updated_at", "run_at") and isinstance(bad, float):
        return
    raw[field] = bad
    with pytest.raises(CorruptJob):
        decode_job(orjson.dumps(raw))


@pytest.mark.parametrize("field", ["id", "kind", "state", "attempts", "revision", "run_at"])
def test_decode_refuses_a_missing_field(field: str) -> None:
    raw = orjson.loads(encode_job(_job()))
    del raw[field]
    with pytest.raises(CorruptJob):
        decode_job(orjson.dumps(raw))


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00\xff garbage", b"[1, 2]", b"null", b'"str"', b"{", b'{"id": "j1"}'],
)
def test_decode_refuses_garbage(data: bytes) -> None:
    with pytest.raises(CorruptJob):
        decode_job(data)


def test_decode_refuses_an_unknown_state_name() -> None:
    raw = orjson.loads(encode_job(_job()))
    raw["state"] = "running"
    with pytest.raises(CorruptJob):
        decode_job(orjson.dumps(raw))


def test_decode_refuses_an_unknown_format_version() -> None:
    raw = orjson.loads(encode_job(_job()))
    key = next(k for k in ("v", "version", "format") if k in raw)
    raw[key] = 999
    with pytest.raises(CorruptJob):
        decode_job(orjson.dumps(raw))


def test_decode_refuses_an_id_not_matching_the_file_name() -> None:
    with pytest.raises(CorruptJob):
        decode_job(encode_job(_job(id="j1")), expect_id="j2")


def test_decode_refuses_a_state_not_matching_the_directory() -> None:
    with pytest.raises(CorruptJob):
        decode_job(encode_job(_job(state=JobState.READY)), expect_state=JobState.COMPLETED)


@pytest.mark.parametrize("bad_id", ["../x", "a/b", "", "a\x00b"])
def test_decode_refuses_a_path_like_id_stored_in_a_file(bad_id: str) -> None:
    raw = orjson.loads(encode_job(_job()))
    raw["id"] = bad_id
    with pytest.raises(CorruptJob):
        decode_job(orjson.dumps(raw))


def test_decode_refuses_a_leased_job_without_a_lease() -> None:
    raw = orjson.loads(encode_job(_job(state=JobState.LEASED,
                                       lease=LeaseInfo(token=3, owner="w", expires_at=9.0))))
    raw["lease"] = None
    with pytest.raises(CorruptJob):
        decode_job(orjson.dumps(raw))


@pytest.mark.parametrize(
    "lease",
    [[], "x", {"token": "3", "owner": "w", "expires_at": 9.0},
     {"token": 3, "owner": 5, "expires_at": 9.0}, {"token": 3, "owner": "w"},
     {"token": True, "owner": "w", "expires_at": 9.0}],
)
def test_decode_refuses_a_lease_of_the_wrong_shape(lease: Any) -> None:
    raw = orjson.loads(encode_job(_job(state=JobState.LEASED,
                                       lease=LeaseInfo(token=3, owner="w", expires_at=9.0))))
    raw["lease"] = lease
    with pytest.raises(CorruptJob):
        decode_job(orjson.dumps(raw))


def test_encode_refuses_a_job_over_max_bytes() -> None:
    with pytest.raises(JobTooLarge):
        encode_job(_job(payload="x" * 70_000))
    big = encode_job(_job(payload="x" * 1000), max_bytes=10**6)
    with pytest.raises(JobTooLarge):
        encode_job(_job(payload="x" * 1000), max_bytes=len(big) - 1)
    assert encode_job(_job(payload="x" * 1000), max_bytes=len(big)) == big


def test_encode_refuses_a_payload_that_is_not_json() -> None:
    with pytest.raises(InvalidJob):
        encode_job(_job(payload={"s": {1, 2}}))


def test_generated_ids_are_valid_unique_and_in_creation_order() -> None:
    ids = [new_job_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    for i in ids[:20]:
        assert decode_job(encode_job(_job(id=i))).id == i


@pytest.mark.parametrize(
    "err",
    [
        InvalidJob("bad", field="kind"),
        JobTooLarge("big", size=10, limit=5),
        JobNotFound("j1"),
        LeaseLost("j1", 7, "expired"),
        InvalidTransition("j1", "completed", "cancel"),
        SpoolError("nope", path="/x"),
    ],
)
def test_errors_pickle_with_their_attributes(err: JobspoolError) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert back.__dict__ == err.__dict__
    assert "\n" not in str(err)
