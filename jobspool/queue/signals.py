"""Handler control-flow signals. Not faults: they say how a job should be settled."""

from __future__ import annotations


class Retry(Exception):
    """Raise from a handler to retry the job later (`delay` seconds, or the backoff)."""

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        from jobspool.queue.payload import validate_delay

        reason = "retry requested" if reason is None else str(reason)
        super().__init__(reason)
        self.reason = reason
        # Checked here, as `fail(delay=)` checks it: refused only at the settle, a NaN or
        # negative delay was dropped for the normal backoff with a note in last_error.
        self.delay = None if delay is None else validate_delay(delay, "Retry(delay=...)")

    def __reduce__(self) -> tuple[object, ...]:
        return (_retry, (self.reason, self.delay))


class Fail(Exception):
    """Raise from a handler to dead-letter the job now, without further attempts."""

    def __init__(self, reason: str = "failed permanently") -> None:
        # `Fail(None)` or `Fail(some_object)`: still a readable reason, not "NoneType: None";
        # `Fail("")` left an operator a dead letter with no reason at all.
        reason = "failed permanently" if reason is None else str(reason)
        reason = reason if reason.strip() else "failed permanently"
        super().__init__(reason)
        self.reason = reason


def _retry(reason: str, delay: float | None) -> Retry:
    return Retry(reason, delay=delay)
