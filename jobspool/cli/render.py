"""How the CLI prints: `--json` documents, JSON log lines, and jobs for people.

Every command prints through `_emit`, so `--json` (one JSON document on
stdout) and `--log-format json` (one JSON line on stderr for a long-running
command's summary) behave the same everywhere; jobs are shown by `_job_doc`
(JSON), `_job_line` (a list row) and `_job_text` (`show`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from jobspool.errors import json_safe


def interrupted_text(count: int) -> str:
    """A summary's mention of the runs a shutdown cut off (attempt counted), if any."""
    return f", interrupted {count} (attempt counted)" if count else ""


def json_text(doc: Any) -> str:
    """`doc` as the CLI's indented JSON."""
    try:
        out = orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str)
    except TypeError:  # a file name that is not UTF-8 (`json_safe` spells its bytes)
        out = orjson.dumps(json_safe(doc), option=orjson.OPT_INDENT_2, default=str)
    return out.decode()


def _emit(args: argparse.Namespace, doc: Any, text: str | Callable[[], str]) -> None:
    if getattr(args, "log_format", "text") == "json":
        # A long-running command logging JSON: its summary is one more JSON line on stderr,
        # always (README), `--json` or not.
        from jobspool.logs import summary

        summary(str(getattr(args, "command", "jobspool")), doc)
    if args.json:
        write_out(json_text(doc) + "\n", flush=True)
    elif getattr(args, "log_format", "text") != "json":
        write_out((text() if callable(text) else text).rstrip("\n") + "\n", flush=True)
    else:
        write_out("", flush=True)


def write_out(text: str, *, flush: bool = False) -> None:
    """Write the command's output to stdout, a failure there said as such."""
    try:
        sys.stdout.write(text)
        if flush:
            sys.stdout.flush()
    except BrokenPipeError:
        raise
    except KeyboardInterrupt as exc:  # SIGINT/SIGTERM while stdout blocked: output cut
        exc.output_cut = True  # type: ignore[attr-defined]
        raise
    except OSError as exc:
        # stdout itself (`> /dev/full`): not the spool's disk, which the generic OSError
        # hint would blame, sending the user to `jobspool recover`.
        raise StdoutFailed(exc.strerror or str(exc)) from None


class StdoutFailed(Exception):
    """The command's output could not be written to stdout (its work is done)."""


@contextlib.contextmanager
def handlers_print_to_stderr(args: argparse.Namespace) -> Iterator[None]:
    """With `--json`, what handlers print goes to stderr for the run (`stdout_to_stderr`):
    stdout must hold one JSON document, the summary, for whatever parses it."""
    if not getattr(args, "json", False):
        yield
        return
    with stdout_to_stderr():
        yield


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """What is printed meanwhile goes to stderr, and stdout is given back afterwards, also
    on error. File descriptor 1 is pointed at stderr too: a child process, a C extension or
    `os.write(1, ...)` bypass `sys.stdout`, and worker processes inherit the descriptor."""
    sys.stdout.flush()
    try:
        saved: int | None = os.dup(1)
    except OSError:  # stdout closed: nothing to keep clean at that level
        saved = None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


_TIME_FIELDS = ("created_at", "updated_at", "run_at")


def _job_doc(job: Any) -> dict[str, Any]:
    """A job as `--json` prints it: the file's fields plus `status` (`scheduled` for a
    delayed job) and ISO 8601 forms of its times (`run_at_iso`, ...)."""
    from jobspool.queue.job import iso_time

    d: dict[str, Any] = job.to_dict()
    d["status"] = job.status
    for k in _TIME_FIELDS:
        d[f"{k}_iso"] = iso_time(d[k])
    return d


def _job_line(job: Any) -> str:
    from jobspool.queue.job import iso_time

    when = (f"due {iso_time(job.run_at)}" if job.state.value in ("retryable", "ready")
            else f"updated {iso_time(job.updated_at)}")
    return (f"{job.id:<28} {job.status:<11} {job.kind:<16} attempts={job.attempts}/"
            f"{job.max_attempts} priority={job.priority} {when}"
            + (f"  last_error={job.last_error[:60]!r}" if job.last_error else ""))


# Job errors, tracebacks and damaged files may hold anything; on a terminal an escape
# sequence would act instead of showing, and a bidirectional override (U+202E) would show
# the text after it reversed ("Trojan source"); `list` escapes them already (repr).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with control characters other than newline and tab, and bidirectional
    controls, shown as `\\xNN` / `\\uNNNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)


def _job_text(job: Any) -> str:
    from jobspool.queue.job import iso_time

    lines = []
    for k, v in job.to_dict().items():
        if k == "state" and job.status != v:
            # Shown as what it is to people (a delayed job, never run), not as a failed retry;
            # the directory is named for operators who look at the disk.
            text = f"{job.status} (not run yet, due at run_at; kept in {v}/)"
        elif k in _TIME_FIELDS:
            text = f"{iso_time(v)} ({v})"
        elif k == "lease" and isinstance(v, dict) and "expires_at" in v:
            text = (f"token {v.get('token')}, held by {v.get('owner')}, expires "
                    f"{iso_time(v['expires_at'])} ({v['expires_at']})")
        else:
            text = printable(v) if isinstance(v, str) else orjson.dumps(v).decode()
        # A value's own line breaks are indented under it: a handler's error must not be
        # able to print lines that read as more fields ("FAKE: ...").
        lines.append(f"{k:>13}: " + text.replace("\n", "\n" + " " * 15))
    return "\n".join(lines)
