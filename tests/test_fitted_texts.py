"""`fitted` (the cut of a failure's texts on a job near `max_job_bytes`), on any texts: the
job as written fits, the error keeps its start and the traceback its end when there is room
for them, and nothing but those two texts changes."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from jobspool.queue.job import encode_job
from jobspool.queue.jobsize import fitted
from jobspool.queue.machine import new_job

MAX = 4096
_chars = st.text(alphabet=st.sampled_from("ab \n\"\\\x01é中\U0001F600"), min_size=1, max_size=8)
# Long texts are the point (a pattern repeated: hypothesis draws mostly short text).
texts = st.builds(lambda pattern, n: pattern * n, _chars, st.integers(0, 1500))


@settings(max_examples=200, deadline=None)
@given(pad=st.integers(0, 2500), error=texts, tb=st.none() | texts)
def test_a_failure_is_cut_to_fit_keeping_both_ends_that_matter(pad: int, error: str,
                                                              tb: str | None) -> None:
    job = new_job(job_id="j", kind="k", payload="x" * pad, now=0.0, delay=0.0, priority=0,
                  max_attempts=3)
    failed = replace(job, last_error="E:" + error, traceback=None if tb is None else tb + "END")
    cut, data = fitted(failed, max_bytes=MAX)
    assert len(data) <= MAX and data == encode_job(cut)
    assert replace(cut, last_error=failed.last_error, traceback=failed.traceback) == failed
    assert cut.last_error is not None
    assert failed.last_error.startswith(cut.last_error.removesuffix("..."))
    if cut.traceback is not None:
        assert cut.traceback.endswith("END")
    room = MAX - len(encode_job(replace(failed, last_error="", traceback=None)))
    if tb is not None and room > 1500:
        # Room for both: neither is dropped for the other.
        assert cut.traceback is not None
        assert len(cut.last_error) >= min(len(failed.last_error), 20)
