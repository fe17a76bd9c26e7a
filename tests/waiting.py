"""One way for a test to wait: poll a condition until it holds, with a deadline.

The deadline only guards against a hang (a test that would otherwise block until the per-test
timeout); it is never a timing claim. Where a process is being waited on, its early exit ends the
wait at once with what it printed on stderr, instead of spending the whole guard.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

GUARD_SECONDS = 60.0
# Short enough that a readiness poll adds no noticeable latency, long enough not to spin a core
# that the process being waited on needs.
_POLL_SECONDS = 0.02


def wait_until(predicate: Callable[[], T], timeout: float = GUARD_SECONDS, what: str = "", *,
               proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
               interval: float = _POLL_SECONDS) -> T:
    """Call `predicate` until it returns something truthy, and return that.

    Fails the test when `timeout` seconds pass first (naming `what`), or, given `proc`, as soon
    as that process has exited (with its exit code and stderr, when stderr was piped and not
    consumed elsewhere). On a timeout a still-running `proc` is killed so the test's cleanup
    does not wait on it.
    """
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"process exited ({proc.returncode}) before {what or predicate}: "
                        f"{_stderr_of(proc)}")
        if time.monotonic() > deadline:
            if proc is not None:
                proc.kill()
                detail = f"; its stderr: {_stderr_of(proc)}"
            else:
                detail = ""
            pytest.fail(f"gave up after {timeout} s waiting for {what or predicate}{detail}")
        time.sleep(interval)


def _stderr_of(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> str:
    """The tail of what an exited (or killed) process wrote on a piped stderr."""
    if proc.stderr is None or proc.stderr.closed:
        return "(stderr not captured)"
    try:
        _, err = proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        return "(stderr unavailable)"
    text = err.decode(errors="replace") if isinstance(err, bytes) else (err or "")
    return text[-3000:]
