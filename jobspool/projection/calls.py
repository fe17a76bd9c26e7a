"""Running one maintenance call against LanceDB: a deadline, one call in flight per table.

LanceDB calls cannot be interrupted, so a call past its deadline is left to
finish in a background thread and its table is skipped until it returns.
`is_conflict` tells a lost commit race (benign) from a fault.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class CallTimedOut(Exception):
    """Raised when a maintenance call did not return within its deadline (it keeps running)."""


_INFLIGHT: set[tuple[str, str]] = set()
_INFLIGHT_LOCK = threading.Lock()


def _busy(slot: tuple[str, str]) -> bool:
    with _INFLIGHT_LOCK:
        return slot in _INFLIGHT


def _call_with_deadline(fn: Callable[[], T], timeout: float, slot: tuple[str, str]) -> T:
    """Run `fn` in a daemon thread and wait at most `timeout` seconds for it.

    LanceDB calls cannot be interrupted; one that hangs (a stuck object-store
    request, a huge compaction) is abandoned, not killed. Its table stays in
    `_INFLIGHT` until it returns, so no second maintenance call piles onto it.
    """
    done = threading.Event()
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller, never lost in the thread
            box.append((False, exc))
        finally:
            with _INFLIGHT_LOCK:
                _INFLIGHT.discard(slot)
            done.set()

    with _INFLIGHT_LOCK:
        _INFLIGHT.add(slot)
    threading.Thread(target=run, name=f"jobspool-maintain-{slot[1]}", daemon=True).start()
    if not done.wait(timeout):
        raise CallTimedOut(f"call did not return within {timeout:g}s; left running")
    ok, value = box[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def is_conflict(exc: BaseException) -> bool:
    """Whether a LanceDB error is a lost commit race (benign: retry later), not a fault."""
    text = str(exc).lower()
    return "conflict" in text or "incompatible transaction" in text


__all__ = ["CallTimedOut", "is_conflict"]
