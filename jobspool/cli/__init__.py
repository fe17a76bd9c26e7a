"""The `jobspool` command line (DESIGN §8). Commands call the public API only.

Exit codes: 0 success, 1 usage or bad input (one line, no traceback), 2 the
spool is unhealthy or an operation was refused.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence

import orjson

from jobspool.cli.common import (
    EXIT_OK,
    EXIT_UNHEALTHY,
    EXIT_USAGE,
    Refused,
    UsageError,
    _waiting_for_lock,
)
from jobspool.cli.parser import build_parser
from jobspool.cli.render import StdoutFailed
from jobspool.errors import (
    Backpressure,
    ConfigError,
    DuplicateJob,
    InvalidTransition,
    JobspoolError,
    SpoolError,
    undecodable_escaped,
)

__all__ = ["EXIT_OK", "EXIT_UNHEALTHY", "EXIT_USAGE", "build_parser", "main"]


# ---------------------------------------------------------------- main


def _exit_code_for(exc: JobspoolError) -> int:
    from jobspool.queue.worker import WorkerCrashed

    if isinstance(exc, ConfigError):  # an `InvalidRoot` too: bad input, not a refusal
        return EXIT_USAGE
    # A taken id under --on-conflict error is the spool refusing, like a bad transition.
    if isinstance(exc, SpoolError | InvalidTransition | DuplicateJob | Backpressure
                  | WorkerCrashed):
        return EXIT_UNHEALTHY
    return EXIT_USAGE


# Commands that serve until stopped: a file reported once would never be again, however
# often it was mended and damaged meanwhile.
_SERVING = frozenset({"worker", "run-until-idle", "dashboard", "demo"})
# Commands whose output is all they do: started with stdout closed, they fail
# (`_ClosedStdout`). The others did their work, which a non-zero exit would invite a
# script to repeat (an enqueue twice).
_READS = frozenset({("stats", None), ("list", None), ("show", None), ("fsck", None),
                    ("health", None), ("quarantine", "list"), ("quarantine", "show"),
                    ("schedules", None)})



def _is_read(args: argparse.Namespace) -> bool:
    return (args.command, getattr(args, "action", None)) in _READS


_ARGV: list[str] = []  # for `_fail`: errors found before logging is set up


# A JSON number (RFC 8259). A negative one is a payload, not an option: argparse leaves
# it over once the payload's place has passed (`enqueue ok --id n1 -1`), and anywhere when
# it is not a plain `-1`/`-0.5` (`-1e5`).
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command line, with `enqueue`'s optional PAYLOAD taken after options too
    (`enqueue KIND --id X PAYLOAD`, `... --id X -- PAYLOAD`): argparse fills an optional
    positional at the first chance, empty, and then calls the payload an unrecognized
    argument."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "payload", "") is None:
        if extra[:1] == ["--"] and len(extra) <= 2:  # `--id X -- [PAYLOAD]` keeps the `--`
            args.payload, extra = (extra[1] if len(extra) == 2 else None), []
        elif len(extra) == 1 and (extra[0] == "-" or not extra[0].startswith("-")
                                  or _JSON_NUMBER.fullmatch(extra[0])):
            args.payload, extra = extra[0], []
    if extra:
        parser.error("unrecognized arguments: " + " ".join(extra))
    return args


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised the way Ctrl-C is: what runs unwinds, and a batch of renames in
    flight lands whole first (`queue/interrupts.py`), instead of the process dying in it."""


_terminating = False


def _terminated(signum: int, frame: object) -> None:
    global _terminating
    if _terminating:
        # Unwinding for the first one already: a repeat (GNU `timeout` signals the child,
        # then its whole group) raised again inside the unwinding and printed a traceback.
        return
    _terminating = True
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    global _terminating
    _terminating = False  # a call of its own: an earlier call's SIGTERM is no repeat here
    _closed_streams_to_devnull()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if in_main else None
    own = argv is None and in_main  # the process's own command line, not a caller's call
    if own and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started in the background by a script (`jobspool worker &`), SIGINT comes in
        # ignored: a `kill -INT` while `--app` imported was lost (the worker served on,
        # `run-until-idle` ran the jobs and exited 0), yet honoured once the run began.
        # Honoured throughout, as an interactive start has it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = _main(argv)
    finally:
        if own:
            # The command is done and its exit code decided: a second SIGTERM or Ctrl-C
            # now (a supervisor repeating its stop) must not turn exit 0 into "killed by
            # signal" while leftover threads get their second (`worker --processes`).
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
        elif previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if own:
        _exit_past_leftover_threads(code)
    return code


def _exit_past_leftover_threads(code: int) -> None:
    """Exit now when threads a handler started (not daemons) are still running: the
    interpreter would wait for them at exit, and a worker stopped within its grace stayed
    up for ever (a pool's child too). Its work is done and settled by now."""
    import time

    # The run's own threads (anyio's idle workers) end within moments of the loop: give
    # them a second, so that only what a handler left is named (and nothing on a plain run).
    deadline = time.monotonic() + 1.0
    left = []
    for t in threading.enumerate():
        if t is threading.main_thread() or t.daemon:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            left.append(t.name)
    if not left:
        return
    logging.getLogger("jobspool").warning(
        "exiting without waiting for %d thread(s) a handler left running (%s)", len(left),
        ", ".join(left[:5]))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _closed_streams_to_devnull() -> None:
    """A command started with stdout or stderr closed (`>&-`, a daemon manager that closes
    them) has `sys.stdout` None: its first print raised AttributeError with a traceback
    nobody could read, after the work was done. Their descriptors are taken by /dev/null
    (left free, the next file opened, a job file, would take them and get what is printed);
    a one-shot command's output fails there as on `/dev/full` (`_ClosedStdout`)."""
    _CLOSED.clear()
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            _CLOSED[name] = open(os.devnull, "w")  # noqa: SIM115 (for the process's life)
            setattr(sys, name, _CLOSED[name])


_CLOSED: dict[str, object] = {}  # the /dev/null files holding closed standard streams' fds


class _ClosedStdout(io.TextIOBase):
    """stdout of a reading command (`_READS`) started with it closed: writing fails, so the
    command says its output was lost and exits non-zero, as `cat >&-` does. Dropped
    silently, a script read exit 0 and never knew `list` or `stats` printed nothing."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout was closed when the command started")


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _ARGV[:] = argv
    import warnings

    from jobspool.errors import CorruptFileWarning

    # The same event is logged as a warning already; one line per bad file is enough.
    warnings.simplefilter("ignore", CorruptFileWarning)
    # On each logger that logs it: a logger's filters see only its own records, not those
    # of its children (psycopg.transaction's "... rollback of <Transaction ...>" went by).
    for name in _ROLLBACK_LOGGERS:
        logging.getLogger(name).addFilter(_rollback_noise)  # once: the same object
    # Before parsing (a refused command line still answers in JSON); argparse also takes
    # an unambiguous prefix (`--js`), which must count too.
    as_json = any(len(a) > 3 and "--json".startswith(a) for a in argv)
    try:
        args = _parse(argv)
        if not hasattr(args, "json") or args.json is None:
            args.json = False
        as_json = bool(args.json)
        if getattr(args, "command", None) in _SERVING:
            return _ungrouped(args.func, args)
        if "stdout" in _CLOSED and _is_read(args):
            sys.stdout = _ClosedStdout()
        from jobspool.queue import lockwait
        from jobspool.queue.unreadable import reported_once

        # A one-shot command says each unreadable file once: `cancel --kind` listed then
        # read under the lock, and printed every skip twice. It says so when it waits long
        # for the spool lock: `stats` behind a stopped process's fenced block sat silent.
        with reported_once(), lockwait.noticed(_waiting_for_lock):
            return _ungrouped(args.func, args)
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE, as_json)
    except Refused as exc:
        return _fail(str(exc), EXIT_UNHEALTHY, as_json)
    except JobspoolError as exc:
        return _fail(str(exc), _exit_code_for(exc), as_json)
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE, as_json)
    except StdoutFailed as exc:
        _stdout_to_devnull()  # the exit's own flush must not fail on it again
        # A read did nothing but its output; a change stays made whatever its output did.
        did = "" if _is_read(args) else " (what the command did stands)"
        return _fail(f"cannot write the output to stdout: {exc}{did}", EXIT_UNHEALTHY, False)
    except BrokenPipeError:
        # The reader went away (`jobspool list | head`): nothing to say to it, and writing
        # the error to the same pipe raised again (two chained tracebacks with --json).
        _stdout_to_devnull()
        return 128 + 13  # as a command killed by SIGPIPE
    except OSError as exc:
        from jobspool.queue.diskerrors import os_hint

        where = f": {exc.filename}" if exc.filename else ""
        hint = os_hint(exc.errno)
        # The hint every other write failure gives (a full disk: free space, then recover).
        return _fail(f"{exc.strerror or exc}{where}" + (f"; {hint}" if hint else ""),
                     EXIT_UNHEALTHY, as_json)
    except KeyboardInterrupt as exc:
        # One line, not a silent exit: changes already made stand, each one whole.
        term = isinstance(exc, _Terminated)
        if term and _pool_child():
            # Its supervisor stopped it (at a pool's stop, while it was still booting) or
            # logs its death and replaces it: a line of its own was noise on the pool's
            # stderr at every stop.
            return 143
        done = getattr(exc, "done", None)  # what a bulk command had done (`_bulk_move`)
        # Cut while writing its output (a slow reader's full pipe): a JSON error document
        # after half of the output made stdout one invalid document; stderr says it all.
        return _fail(f"interrupted by {'SIGTERM' if term else 'SIGINT'}; what was done "
                     "before it stands" + (f": {done}" if done else ""),
                     143 if term else 130, as_json and not getattr(exc, "output_cut", False))


_ROLLBACK_LOGGERS = ("psycopg", "psycopg.transaction")


def _rollback_noise(record: logging.LogRecord) -> bool:
    """Drop psycopg's "error ignored in rollback of <Transaction ...>" (logged as a command
    is interrupted, or loses its connection, inside a transaction: the rollback meets the
    statement still in flight). The command says what happened in its own one line; the
    extra line came before it in 4 of 9 interrupted bulk cancels and migrates (a probe)."""
    return not str(record.msg).startswith("error ignored in rollback")


def _pool_child() -> bool:
    from jobspool.queue.poolchild import is_pool_child

    return is_pool_child()


def _ungrouped(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return int(func(args))
    except BaseExceptionGroup as group:
        # A task group's wrapping of what one task raised (EMFILE importing a module at
        # `ulimit -n 10`) printed 108 lines of traceback, exit 1: its first cause is the
        # one line the handlers below know how to say.
        raise _first_leaf(group) from None


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _stdout_to_devnull() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def _fail(message: str, code: int, as_json: bool) -> int:
    line = undecodable_escaped(" ".join(message.split()))
    if as_json:
        try:
            sys.stdout.write(orjson.dumps({"ok": False, "error": line, "exit": code}).decode()
                             + "\n")
            sys.stdout.flush()
        except OSError:  # stdout is what failed: the line below on stderr still says why
            _stdout_to_devnull()
    from jobspool.logs import error_line, json_lines

    if json_lines(_ARGV):
        error_line(line, code)  # `--log-format json`: every stderr line is JSON
    else:
        sys.stderr.write(f"jobspool: error: {line}\n")
    return code
