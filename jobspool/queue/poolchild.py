"""The child's side of `worker --processes N`: what a pool child tells its supervisor.

Over the pipe the supervisor hands it (`JOBSPOOL_POOL_FD`), one short line
per event: `S <job_id> <token> <timeout>` when a handler starts, `E <job_id>
<token>` when it ends, `H <job_id> <token>` when a sync handler ran past its
time limit (the child then stops, so that the supervisor replaces it), and
`P <json>`, its counts so far, after every settle (a child killed before it
could say goodbye is still counted), and `R <json>`, its run's report, as it
exits. The supervisor is
`jobspool.queue.pool.WorkerPool`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Callable

    from jobspool.queue.context import Context
    from jobspool.queue.report import RunReport
    from jobspool.queue.worker import Worker

log = logging.getLogger("jobspool.queue.pool")

POOL_FD_ENV = "JOBSPOOL_POOL_FD"
POOL_OWNER_ENV = "JOBSPOOL_POOL_OWNER"
POOL_PARENT_ENV = "JOBSPOOL_POOL_PARENT"


_CHILD: list[tuple[int, str | None, int] | None] = []  # read once: (fd, owner, parent)


def _pool_child() -> tuple[int, str | None, int] | None:
    """(pipe fd, owner, supervisor pid) when this process is a pool child, else None.

    Read once and taken out of the environment: a `jobspool worker` a handler started
    inherited them, took itself for a pool child ("the pool supervisor is gone"), ran
    nothing, and wrote to a descriptor number that meant nothing in it. Its parent must
    be the supervisor named, for the same reason."""
    if not _CHILD:
        fd_text = os.environ.pop(POOL_FD_ENV, None)
        owner = os.environ.pop(POOL_OWNER_ENV, None)
        parent = int(os.environ.pop(POOL_PARENT_ENV, None) or 0)
        ours = fd_text is not None and fd_text.isdigit() and (
            not parent or os.getppid() == parent or _orphaned(int(fd_text)))
        _CHILD.append((int(fd_text), owner, parent) if ours and fd_text else None)
    return _CHILD[0]


def _orphaned(fd: int) -> bool:
    """Whether `fd` is a pipe whose reading end is closed: this process is a pool child whose
    supervisor died before it looked (reparented already). Taken for someone else's process,
    such a child ran on as a standalone worker for ever, unsupervised (a SIGKILL probe: the
    supervisor killed while its children started). A process that merely inherited the
    environment (a handler's) has no such pipe at that number."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def is_pool_child() -> bool:
    return _pool_child() is not None


def report_to_supervisor(report: dict[str, Any]) -> bool:
    """In a pool child, hand the run's report to the supervisor (`R <json>`, one line), which
    sums the children's; False (nothing sent) when this process is not a pool child."""
    child = _pool_child()
    if child is None:
        return False
    with contextlib.suppress(OSError):  # the supervisor is gone: nobody to tell
        os.write(child[0], b"R " + orjson.dumps(report) + b"\n")
    return True


def attach_child(worker: Worker) -> Callable[[RunReport], None] | None:
    """In a pool child (its environment says so), report to the supervisor, and return the
    `progress` callback for its run, which sends the counts after every settle (`P <json>`);
    None when this process is not a pool child."""
    child = _pool_child()
    if child is None:
        return None
    fd, owner, parent = child
    worker.owner = owner or worker.owner
    # The children share the pool's stdout: block-buffered, one child's 8 KiB write cut
    # another's line in two; unbuffered (PYTHONUNBUFFERED, `-u`: write-through), print()'s
    # text and its newline are two writes, and another child's line lands between them.
    # A line at a time, in one write, each reaches the output whole.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)
    def send(line: str) -> None:
        # One short write: atomic on a pipe. If the supervisor is gone the write fails,
        # and the parent watch below stops us.
        with contextlib.suppress(OSError):
            os.write(fd, line.encode() + b"\n")

    def began(ctx: Context) -> None:
        timeout = (ctx.job.timeout if ctx.job.timeout is not None
                   else worker.timeout_for(ctx.job.kind)) or 0.0
        send(f"S {ctx.job_id} {ctx.token} {timeout:g}")

    def on_start(ctx: Context) -> None:
        # A time-limited sync handler says so from its thread as it begins (`on_began`):
        # sent here, a handler whose thread had not begun when another froze the loop was
        # killed (and dead-lettered) for a limit it never started to use.
        if not ctx.start_in_thread:
            began(ctx)

    told: set[int] = set()  # tokens whose end was sent from the handler's thread

    def on_returned(ctx: Context) -> None:
        # From the handler's thread: a loop held up past the job's limit (another handler
        # blocking it) made the supervisor kill this child for a job that returned in time.
        told.add(ctx.token)
        send(f"E {ctx.job_id} {ctx.token}")

    def on_end(ctx: Context) -> None:
        if ctx.token in told:
            told.discard(ctx.token)
        elif not ctx.hung:
            send(f"E {ctx.job_id} {ctx.token}")

    def on_hung(ctx: Context) -> None:
        send(f"H {ctx.job_id} {ctx.token}")
        log.warning("stopping this worker process so that the supervisor replaces it: a "
                    "sync handler cannot be stopped otherwise")
        worker.stop()

    worker.on_start, worker.on_end, worker.on_hung = on_start, on_end, on_hung
    worker.on_returned, worker.on_began = on_returned, began
    worker.reclaims_dead = False  # the supervisor settles a dead sibling's jobs, knowing why

    if parent and os.getppid() != parent:
        # Orphaned before it started (`_orphaned`): stop before the run claims anything.
        log.warning("the pool supervisor is gone; stopping")
        worker.stop()

    def watch_parent() -> None:
        # start_new_session cut us off from the terminal: notice an orphaning ourselves.
        while not worker.stopping:
            if parent and os.getppid() != parent:
                log.warning("the pool supervisor is gone; stopping")
                worker.stop()
                return
            time.sleep(1.0)

    threading.Thread(target=watch_parent, name="jobspool-pool-parent", daemon=True).start()

    def progress(report: RunReport) -> None:
        # A killed child never sends its final report: these stand in (one short write
        # per settled group).
        send("P " + orjson.dumps(report.to_dict()).decode())

    # Booted: its app imported and its spool open. Killed from outside after this (an
    # operator's SIGKILL of an idle child), it is no boot failure: five such deaths read
    # "died right after starting" and the whole pool gave up.
    send("B - 0")
    return progress
