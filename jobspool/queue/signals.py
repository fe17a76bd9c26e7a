"""Handler control-flow signals. Not faults: they say how a job should be settled."""

from __future__ import annotations

from jobspool.errors import InvalidJob


class Retry(Exception):
    """Raise from a handler to retry the job later (`delay` seconds, or the backoff)."""

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        from jobspool.queue.payload import validate_delay

        reason = "retry requested" if reason is None else str(reason)
        super().__init__(reason)
        self.reason = reason
        # Checked here, as `fail(delay=)` checks it: refused only at the settle, a NaN or
        # negative delay was dropped for the normal backoff with a note in last_error.
        try:
            self.delay = None if delay is None else validate_delay(delay, "Retry(delay=...)")
        except InvalidJob as exc:
            raise RetryDelayRefused(exc.message, field=exc.field) from None

    def __reduce__(self) -> tuple[object, ...]:
        return (_retry, (self.reason, self.delay))


class RetryDelayRefused(InvalidJob):
    """`Retry(delay=...)` with a delay no job can take (NaN, negative, past 9999). Raised
    from a handler, the run is still retried (on the normal backoff), whatever its kind's
    `Policy(retry_on=...)` lists: the handler asked for a retry, and a computed delay a
    little below zero dead-lettered the job at its first attempt."""


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
