"""Replay hooks that misbehave (DESIGN §6 step 4): `--app tests.apps.replays:<name>`.

`chatty` prints (at import and while replaying), `async_hooks` are coroutine
functions, `one_hook` is a single hook for every kind on a plain object.
"""

from __future__ import annotations

from typing import Any

from jobspool import App, Job

print("loading tests.apps.replays")  # the point: output at import time


def _noop(job: Job, ctx: Any) -> None:
    return None


def _committed(job: Job) -> str:
    print("replaying", job.id)  # user code printing
    return "committed"


async def _async_committed(job: Job) -> str:
    return "committed"


chatty = App(handlers={"k": _noop}, replay={"k": _committed})
async_hooks = App(handlers={"k": _noop}, replay={"k": _async_committed})


class _Loose:
    handlers = {"k": _noop}  # noqa: RUF012 - a user's plain object, as `--app` takes it
    replay = staticmethod(_committed)


one_hook = _Loose()
