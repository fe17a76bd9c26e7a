"""`--app` targets that are not `App` instances: a plain mapping, and an object with `handlers`."""

from __future__ import annotations

from typing import Any, ClassVar

from jobspool import Context, Job


def echo(job: Job, ctx: Context) -> Any:
    return job.payload


handlers = {"echo": echo}


class _Registry:
    """Any object with a `handlers` mapping will do (as arq's WorkerSettings)."""

    handlers: ClassVar[dict[str, Any]] = {"echo": echo}


registry = _Registry()

not_handlers = 42
