"""Hypothesis strategies shared by the spool tests: ids, kinds, JSON payloads, job records."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from jobspool.queue.job import Job, LeaseInfo
from jobspool.queue.states import JobState

_ID_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_ID_REST = _ID_FIRST + "._-"
_KIND_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_KIND_REST = _KIND_FIRST + "0123456789_.-"

# Valid caller-given ids: [A-Za-z0-9][A-Za-z0-9._-]{0,127}
job_ids = st.builds(
    lambda a, b: a + b,
    st.sampled_from(_ID_FIRST),
    st.text(alphabet=_ID_REST, max_size=127),
)
short_job_ids = st.builds(
    lambda a, b: a + b,
    st.sampled_from(_ID_FIRST),
    st.text(alphabet=_ID_REST, max_size=12),
)
# Valid kinds: [A-Za-z][A-Za-z0-9_.-]{0,127} (DESIGN §9)
kinds = st.builds(
    lambda a, b: a + b,
    st.sampled_from(_KIND_FIRST),
    st.text(alphabet=_KIND_REST, max_size=127),
)

# Ids a caller might try that must be refused before any path is built.
BAD_JOB_IDS: list[Any] = [
    "",
    "../x",
    "..",
    ".",
    ".hidden",
    "-dash",
    "_under",
    "a/b",
    "/abs",
    "a\\b",
    "a\x00b",
    "a b",
    "a\nb",
    "x" * 129,
    "y" * 130,
    "ü",
    "a:b",
    42,
    b"bytes",
]
BAD_KINDS: list[Any] = [
    "",
    "1abc",
    "_x",
    ".x",
    "-x",
    "a/b",
    "../x",
    "a\x00b",
    "a b",
    "a:b",
    "k" * 129,
    None,
    7,
]

# JSON values that orjson round-trips exactly: 64-bit ints, finite floats,
# strings without lone surrogates, lists and str-keyed objects.
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_text, children, max_size=4),
    ),
    max_leaves=12,
)

_times = st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False)


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    """A well-formed job record in any state, with a lease exactly when leased (a lease
    outside `leased/` is a value no transition writes: readers refuse it)."""
    state = draw(st.sampled_from(list(JobState)))
    lease: LeaseInfo | None = None
    if state is JobState.LEASED:
        lease = LeaseInfo(
            token=draw(st.integers(min_value=1, max_value=2**62)),
            owner=draw(_text.filter(bool)),  # no claim writes an empty owner (readers refuse it)
            expires_at=draw(_times),
        )
    return Job(
        id=draw(job_ids),
        kind=draw(kinds),
        payload=draw(json_values),
        state=state,
        priority=draw(st.integers(min_value=-1000, max_value=1000)),
        attempts=draw(st.integers(min_value=0, max_value=100)),
        max_attempts=draw(st.integers(min_value=1, max_value=100)),
        revision=draw(st.integers(min_value=1, max_value=2**40)),
        created_at=draw(_times),
        updated_at=draw(_times),
        run_at=draw(_times),
        lease=lease,
        last_error=draw(st.none() | _text),
        result=draw(json_values),
        reservations=tuple(draw(st.lists(st.text(alphabet="0123456789abcdef", min_size=1,
                                                  max_size=16), max_size=3))),
        rescues=draw(st.integers(min_value=0, max_value=10)),
    )
