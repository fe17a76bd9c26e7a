"""Shared pieces of the command line: exit codes, errors, argument types, output."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_UNHEALTHY = 2


class UsageError(Exception):
    """Bad command-line input: exit 1 with one line."""


class Refused(Exception):
    """An operation was refused or the spool is unhealthy: exit 2 with one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # A subcommand's parser names itself (`jobspool worker: ...`); the top level's name
        # is already the line's prefix (`jobspool: error: ...`).
        where = self.prog.partition(" ")[2]
        raise UsageError(f"{where}: {message}" if where else message)


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
        if isinstance(value, int) and value > sys.maxsize:
            # It reached the command and failed there as "Stop argument for islice()...".
            raise argparse.ArgumentTypeError(f"{text!r} is too large (at most {sys.maxsize})")
        return value

    return parse


_positive_float = _number(float, "a number", strictly_positive=True)
_nonneg_float = _number(float, "a number", strictly_positive=False)
_positive_int = _number(int, "an integer", strictly_positive=True)


def _poll_seconds(text: str) -> float:
    """`--poll`: a positive number, at least the worker's floor (refused here, once, rather
    than in each child of `--processes`)."""
    from jobspool.queue.idle import MIN_POLL_SECONDS

    value = float(_positive_float(text))
    if value < MIN_POLL_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is below {MIN_POLL_SECONDS:g} s (a safety "
                                         "poll: new jobs wake an idle worker at once)")
    return value
_nonneg_int = _number(int, "an integer", strictly_positive=False)


def _lease_seconds(text: str) -> float:
    """`--lease-seconds` (init's and a worker's): positive and at least a worker's floor.
    `init` took 0.001 and fixed it as the spool's lease, which every worker then refused:
    a spool no worker could serve without its own `--lease-seconds`."""
    from jobspool.queue.payload import MIN_WORKER_LEASE

    value = float(_positive_float(text))
    if value < MIN_WORKER_LEASE:
        raise argparse.ArgumentTypeError(f"{text!r} is too short for a worker: at least "
                                         f"{MIN_WORKER_LEASE:g} s (it must start each job and "
                                         "beat its lease within it)")
    return value


_DEMO_MAX_WORKERS = 64


def _demo_workers(text: str) -> int:
    """`demo --workers`: a positive integer, at most `_DEMO_MAX_WORKERS`. A thousand
    processes on one spool queued for minutes on its lock and finished nothing."""
    value = int(_positive_int(text))
    if value > _DEMO_MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{text!r} is too many for the demo (at most "
                                         f"{_DEMO_MAX_WORKERS} worker processes)")
    return value


def _projection_arg(text: str) -> str:
    """`--projection`: a URI or directory, never empty (an empty one fell back to the
    default projection without a word, where `App(projection="")` is refused)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (give a LanceDB URI or directory)")
    if text.lower().startswith("memory://"):
        # Accepted, a worker projected into it and reported rows that died with it.
        raise argparse.ArgumentTypeError("memory:// is LanceDB's in-process database: what a "
                                         "command writes there is gone when it exits (give a "
                                         "directory or an object-storage URI)")
    # As a root is (`_given_root`): quoted in a unit or env file, `~/idx` reached the worker
    # as written and LanceDB expanded it, while `maintain` and `health` looked for a
    # directory named `~`: the operator was told the projection did not exist.
    why = _unexpanded(text.removeprefix("file://"), text, "/home/me/index")
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def _port(text: str) -> int:
    value = int(_nonneg_int(text))
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port")
    return value


def _listen_host(text: str) -> str:
    """An address to listen on, named: blank (an unset `$HOST` in `--metrics-host "$HOST"`)
    made the server listen on every interface, where 127.0.0.1 was meant."""
    if not text.strip() or text != text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an address: give one (127.0.0.1 for this host only; 0.0.0.0 "
            "for every interface, said as such)")
    return text


def _version() -> str:
    from jobspool import __version__

    return __version__


def _state_names() -> list[str]:
    from jobspool.queue.states import JobState

    return [s.value for s in JobState]


def _given_root(args: argparse.Namespace) -> str | None:
    """The root `--root` gives, else `JOBSPOOL_ROOT`, else None; refused when blank or
    padded with whitespace. A blank one was taken as a name (`JOBSPOOL_ROOT=" "` made a
    spool called " " in the working directory), and `--root ""` fell through to
    `JOBSPOOL_ROOT` without a word: a script's unset variable, or a stray space in a
    unit file, pointed commands at a spool nobody meant."""
    root: str | None = getattr(args, "root", None)
    where = "--root"
    if root is None:
        root, where = os.environ.get("JOBSPOOL_ROOT"), "JOBSPOOL_ROOT"
        if not root:
            return None  # set but empty is unset, as shells and most tools take it
    stripped = root.strip()
    if not stripped:
        raise UsageError(f"{where} {root!r} is {'only whitespace' if root else 'empty'}: give "
                         "a spool directory or a postgresql:// URL")
    if root != stripped:
        from jobspool.errors import InvalidRoot
        from jobspool.urls import redact_url

        # As the spool layer refuses the same mistake (`Spool()`): bad input, exit 1.
        shown = redact_url(root)  # the padding kept: it is what is wrong
        raise InvalidRoot(f"{where} {shown!r} has leading or trailing whitespace: give the "
                         "spool directory or URL without it", path=shown)
    # Quoted in a unit file or an env file, `~/spool` and `$HOME/spool` reach us as
    # written: `init` made ./~/spool in the working directory, and a worker served it.
    why = _unexpanded(root, root, "/home/me/spool")
    if why:
        raise UsageError(f"{where} {why}")
    from jobspool.pg import is_url
    from jobspool.queue.rootspec import refuse_url

    if not is_url(root):
        refuse_url(root)  # here, while `file:///x` is still as typed
    return root


def _unexpanded(path: str, shown: str, example: str) -> str | None:
    """Why `path` (as given: `shown`) cannot be meant as written, or None."""
    from jobspool.queue.rootspec import unexpanded_start

    found = unexpanded_start(path)
    if found is None:
        return None
    return (f"{shown!r} starts with {found!r}, which no shell expanded: give the "
            f"path itself (e.g. {example})")


def _root(args: argparse.Namespace) -> Path:
    root = _given_root(args)
    if root is None:
        raise UsageError("no spool given: pass --root DIR or set JOBSPOOL_ROOT")
    return Path(root)


def _root_spec(args: argparse.Namespace) -> str | Path:
    """The spool `--root` names: a directory, or a `postgresql://` URL kept as given
    (a Path would fold its `//`)."""
    from jobspool.pg import is_url

    root = _given_root(args)
    return str(root) if is_url(root) else _root(args)


def _open(args: argparse.Namespace, *, create: bool = False, **kwargs: Any) -> Any:
    from jobspool.queue.spool import Spool

    root = _root_spec(args)
    if isinstance(root, Path) and not kwargs.get("read_only"):
        from jobspool.cli.owner import act_as_owner

        act_as_owner(root)
    return Spool(root, create=create, **kwargs)


# How long `worker` waits at start for a store it cannot reach before it exits 2: a
# database still starting (or failing over) is waited for; a URL that names no server
# (a typo) is not waited for for ever. A running worker's outage is waited out however
# long it lasts (supervisor.py): its store answered once.
START_PATIENCE_SECONDS = 30.0


def _open_waiting(args: argparse.Namespace, *, create: bool = False,
                  patience: float = START_PATIENCE_SECONDS) -> Any:
    """`_open` for a long-running service (`worker`): a store that cannot be reached yet is
    waited for up to `patience` seconds, backing off, instead of exiting at once (a
    signal ends the wait); past that, the last error (exit 2). A store that refuses (a
    wrong password, no such database) is an error at once."""
    from jobspool.errors import StoreUnavailable

    log = logging.getLogger("jobspool.queue.worker")
    deadline = time.monotonic() + patience
    delay = 0.5
    while True:
        try:
            return _open(args, create=create)
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if delay == 0.5:
                log.warning("store unavailable (%s); waiting up to %.0f s for it", exc,
                            patience)
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(5.0, delay * 2)


def _load_app(spec: str | None) -> Any:
    if spec is None:
        return None
    from jobspool.app import AppError, load_app
    from jobspool.cli.render import stdout_to_stderr

    try:
        # What the module prints as it loads is diagnostics: stdout carries the command's
        # answer (one JSON document under --json).
        with stdout_to_stderr():
            return load_app(spec)
    except AppError as exc:
        raise UsageError(str(exc)) from None


def _make_worker(args: argparse.Namespace, spool: Any) -> Any:
    from jobspool.cli.objectstore import storage_options
    from jobspool.queue.worker import Worker

    app = _load_app(args.app)
    kinds = None
    if args.kinds is not None:
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        if not kinds:
            # An empty `--kinds "$KINDS"` ran every kind: a worker meant for some ran all.
            raise UsageError(f"--kinds {args.kinds!r} names no kind (it handles: "
                             f"{', '.join(sorted(app.handlers))})")
        missing = [k for k in kinds if k not in app.handlers]
        if missing:
            raise UsageError(f"--kinds names kinds --app {args.app} has no handler for: "
                             f"{', '.join(missing)} (it handles: "
                             f"{', '.join(sorted(app.handlers))})")
    return Worker(spool, app, concurrency=args.concurrency,
                  batch_size=50 if args.batch_size is None else args.batch_size,
                  kinds=kinds, lease_seconds=args.lease_seconds,
                  projection=args.projection or app.projection,
                  storage_options=storage_options(args, app.storage_options),
                  maintenance=not args.no_maintenance)


def _waiting_for_lock(waited: float) -> None:
    """The notice of a command still waiting for the spool lock (`lockwait.noticed`)."""
    with contextlib.suppress(Exception):
        print(f"jobspool: still waiting for the spool lock after {waited:g} s (busy workers "
              "take turns with it; a long fenced block or a stopped process holds it); "
              "Ctrl-C gives up", file=sys.stderr, flush=True)
