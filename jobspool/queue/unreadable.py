"""Reporting the job files a reader skipped because it could not read them.

Readers skip an unreadable job file (damaged, or not this user's to read) with a log
warning and a `CorruptFileWarning`; a command made of several reads says each file once
(`reported_once`), and one that names the file in its own error says nothing more
(`unreported`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import warnings
from collections.abc import Iterator
from contextvars import ContextVar

from jobspool.errors import CorruptFileWarning, shown_name

_log = logging.getLogger("jobspool.queue")  # the logger these warnings always came from


# The files already reported within `reported_once()`, None outside it.
_reported: ContextVar[set[tuple[str, str]] | None] = ContextVar("_reported", default=None)


@contextlib.contextmanager
def reported_once() -> Iterator[None]:
    """Within it, each unreadable file is reported once (this thread). For a check made of
    several reads of the spool (`health`: stats, then leased and prepared jobs), each of
    which meets the same file: one bad file printed the same warning three times."""
    token = _reported.set(set())
    try:
        yield
    finally:
        _reported.reset(token)


_quiet: ContextVar[bool] = ContextVar("_quiet", default=False)


@contextlib.contextmanager
def unreported() -> Iterator[None]:
    """Within it, unreadable files are not reported: for `show`, whose error names the
    file it could not read (a warning line above it said the same)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


def report_unreadable(directory: str, job_id: str, reason: str) -> None:
    """Say, without raising, that a reader skipped an unreadable job file.

    Both a log warning (for operators) and a `CorruptFileWarning` (for code
    and tests); the CLI silences the latter since it logs the former.
    """
    if _quiet.get():
        return
    seen = _reported.get()
    if seen is not None:
        if (directory, job_id) in seen:
            return
        seen.add((directory, job_id))
    # A permission error is this reader's gap, not a damaged file: recover would not move it.
    denied = reason in (os.strerror(errno.EACCES), os.strerror(errno.EPERM))
    hint = ("this user may not read it: see `jobspool init --access group-read`" if denied
            else "`jobspool recover` moves it to quarantine/")
    message = (f"skipping unreadable job file {shown_name(f'{directory}/{job_id}.json')}: "
               f"{reason} ({hint})")
    _log.warning(message, extra={"job_id": job_id, "state": directory})
    warnings.warn(message, CorruptFileWarning, stacklevel=3)
