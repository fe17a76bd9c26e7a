"""Shared pieces of the command line: exit codes, errors, argument types, output."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import orjson

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_UNHEALTHY = 2


class UsageError(Exception):
    """Bad command-line input: exit 1 with one line."""


class Refused(Exception):
    """An operation was refused or the spool is unhealthy: exit 2 with one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _number(cast: Callable[[str], float], noun: str, *, strictly_positive: bool
            ) -> Callable[[str], Any]:
    """An argparse type: a finite number of `cast`'s kind, positive or non-negative."""
    need = "a positive" if strictly_positive else "a non-negative"

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        ok = value > 0 if strictly_positive else value >= 0  # False for NaN too
        if not ok or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} must be {need} {noun.split()[-1]}")
        return value

    return parse


_positive_float = _number(float, "a number", strictly_positive=True)
_nonneg_float = _number(float, "a number", strictly_positive=False)
_positive_int = _number(int, "an integer", strictly_positive=True)
_nonneg_int = _number(int, "an integer", strictly_positive=False)


def _port(text: str) -> int:
    value = int(_nonneg_int(text))
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port")
    return value


def _version() -> str:
    from jobspool import __version__

    return __version__


def _state_names() -> list[str]:
    from jobspool.queue.states import JobState

    return [s.value for s in JobState]


# ---------------------------------------------------------------- output helpers


def _emit(args: argparse.Namespace, doc: Any, text: str | Callable[[], str]) -> None:
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2, default=str).decode()
                         + "\n")
    elif getattr(args, "log_format", "text") == "json":
        # A long-running command logging JSON: its summary is one more JSON line on stderr.
        from jobspool.logs import summary

        summary(str(getattr(args, "command", "jobspool")), doc)
    else:
        sys.stdout.write((text() if callable(text) else text).rstrip("\n") + "\n")


def _root(args: argparse.Namespace) -> Path:
    root = args.root or os.environ.get("JOBSPOOL_ROOT")
    if not root:
        raise UsageError("no spool given: pass --root DIR or set JOBSPOOL_ROOT")
    return Path(root)


def _root_spec(args: argparse.Namespace) -> str | Path:
    """The spool `--root` names: a directory, or a `postgresql://` URL kept as given
    (a Path would fold its `//`)."""
    from jobspool.pg import is_url

    root = args.root or os.environ.get("JOBSPOOL_ROOT")
    return str(root) if is_url(root) else _root(args)


def _open(args: argparse.Namespace, *, create: bool = False, **kwargs: Any) -> Any:
    from jobspool.queue.spool import Spool

    return Spool(_root_spec(args), create=create, **kwargs)


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
# sequence would act instead of showing.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with control characters other than newline and tab shown as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


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
        lines.append(f"{k:>13}: {text}")
    return "\n".join(lines)


def _load_app(spec: str | None) -> Any:
    if spec is None:
        return None
    from jobspool.app import AppError, load_app

    try:
        return load_app(spec)
    except AppError as exc:
        raise UsageError(str(exc)) from None


def _make_worker(args: argparse.Namespace, spool: Any) -> Any:
    from jobspool.cli.objectstore import storage_options
    from jobspool.queue.worker import Worker

    app = _load_app(args.app)
    kinds = None
    if args.kinds:
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        missing = [k for k in kinds if k not in app.handlers]
        if missing:
            raise UsageError(f"--kinds names kinds --app {args.app} has no handler for: "
                             f"{', '.join(missing)} (it handles: "
                             f"{', '.join(sorted(app.handlers))})")
    return Worker(spool, app, concurrency=args.concurrency, batch_size=args.batch_size,
                  kinds=kinds, lease_seconds=args.lease_seconds,
                  projection=args.projection or app.projection,
                  storage_options=storage_options(args, app.storage_options),
                  maintenance=not args.no_maintenance)
