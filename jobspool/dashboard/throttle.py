"""Guessing the token: wrong tokens from one client address are refused for a while.

The token is the operator's choice and may be short. Unthrottled, a script could try
thousands a second, by the login form or by bearer header. After `MAX_FAILURES` wrong
tokens within `WINDOW_SECONDS` from one address, that address gets 429 (with
`Retry-After`) for its token attempts until the oldest of them is a window old; a right
token in time clears its count. A person mistyping is far from the limit; a six-letter
token at ten tries a minute takes centuries. A stale login cookie (the dashboard was
restarted: its secret is per process) is no guess and is not counted.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable

MAX_FAILURES = 10
WINDOW_SECONDS = 60.0
# Addresses remembered at most: a flood from many addresses must not grow the table
# without bound (the oldest are forgotten first; each still meets the limit on its own).
MAX_CLIENTS = 10_000


class Throttle:
    """Failed token attempts per client address, in a sliding window (thread-safe)."""

    def __init__(self, *, limit: int = MAX_FAILURES, window: float = WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict())

    def wait(self, client: str) -> float:
        """Seconds before `client` may try a token again (0.0: now)."""
        with self._lock:
            times = self._recent(client)
            if times is None or len(times) < self.limit:
                return 0.0
            return max(0.0, times[0] + self.window - self._clock())

    def failed(self, client: str) -> None:
        with self._lock:
            times = self._recent(client)
            if times is None:
                times = self._failures[client] = collections.deque(maxlen=self.limit)
                while len(self._failures) > MAX_CLIENTS:
                    self._failures.popitem(last=False)
            times.append(self._clock())
            self._failures.move_to_end(client)

    def passed(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)

    def _recent(self, client: str) -> collections.deque[float] | None:
        """`client`'s failures still inside the window (None when there are none)."""
        times = self._failures.get(client)
        if times is None:
            return None
        horizon = self._clock() - self.window
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times


def retry_after(seconds: float) -> str:
    """A `Retry-After` header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
