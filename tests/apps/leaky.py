"""Handlers that outlive their own stop (a thread left running, SIGTERM ignored), and one
that naps for its payload's seconds."""

from __future__ import annotations

import signal
import threading
import time

import anyio

from jobspool import Context, Job


def leak(job: Job, ctx: Context) -> str:
    # Not a daemon: the interpreter waits for it at exit, an hour.
    threading.Thread(target=time.sleep, args=(3600,), name="left-behind").start()
    return "ok"


async def deaf(job: Job, ctx: Context) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the worker never hears a stop again
    await anyio.sleep(3600)


def nap(job: Job, ctx: Context) -> str:
    time.sleep(float(job.payload))
    return "ok"


app = {"leak": leak, "deaf": deaf, "nap": nap}
