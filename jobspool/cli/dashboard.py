"""`jobspool dashboard`: serve the web dashboard for one spool (extra `jobspool[web]`)."""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import orjson

from jobspool.cli.common import (
    EXIT_OK,
    Refused,
    UsageError,
    _nonneg_float,
    _port,
    _root_spec,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8177
TOKEN_ENV = "JOBSPOOL_DASHBOARD_TOKEN"


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register `dashboard` on the CLI's subparsers."""
    c = sub.add_parser("dashboard", parents=parents,
                       help="serve a web dashboard for the spool (needs jobspool[web])")
    add_serve_options(c, prefix="")
    c.set_defaults(func=cmd_dashboard)


def add_serve_options(c: argparse.ArgumentParser, *, prefix: str) -> None:
    """--host/--port/--read-only/--token (prefixed for `demo --dashboard`)."""
    c.add_argument(f"--{prefix}host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}; any other address "
                        f"needs --token)")
    c.add_argument(f"--{prefix}port", type=_port, default=DEFAULT_PORT,
                   help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)")
    c.add_argument(f"--{prefix}read-only", action="store_true",
                   help="show only: no requeue, cancel, purge or restore")
    c.add_argument(f"--{prefix}token", default=None,
                   help=f"require this token (bearer header or login form); default "
                        f"${TOKEN_ENV}, which keeps it out of `ps`")
    c.add_argument(f"--{prefix}poll", type=_nonneg_float, default=3.0, metavar="SECONDS",
                   help="how often open pages refresh their figures, in seconds (0: never)")


def cmd_dashboard(args: argparse.Namespace) -> int:
    _check_bind(args.host, args.token)  # the address is refused before anything else is looked at
    from jobspool.logs import setup_logging, startup

    setup_logging(args.log_level, args.log_format)
    startup("dashboard", root=args.root or os.environ.get("JOBSPOOL_ROOT"), host=args.host,
            port=args.port, read_only=args.read_only)
    return serve(_root_spec(args), host=args.host, port=args.port, read_only=args.read_only,
                 token=args.token, poll=args.poll, as_json=args.json)


def _check_bind(host: str, token: str | None, option: str = "--token") -> str | None:
    """The effective token (option, else environment); refuses an unguarded public address."""
    from jobspool.dashboard.security import BindRefused, check_bind

    if token is not None and not token:
        # `--token "$TOKEN"` with the variable unset: on loopback it served without one,
        # saying nothing, though a token was asked for.
        raise UsageError(f"{option} is empty (an unset variable?): give the token, or leave "
                         f"{option} out to use {TOKEN_ENV} or, on loopback, no token")
    token = token or os.environ.get(TOKEN_ENV) or None
    try:
        check_bind(host, token)
    except BindRefused as exc:
        raise Refused(str(exc)) from None
    return token


def _need_web_extra() -> None:
    missing = []
    for module in ("starlette", "uvicorn", "jinja2"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise UsageError(f"the dashboard needs the web extra (missing {', '.join(missing)}): "
                         f"pip install 'jobspool[web]'")


def _open_spool(root: Path | str, read_only: bool) -> Any:
    from jobspool.queue.spool import Spool

    if isinstance(root, Path) and not read_only:
        from jobspool.cli.owner import act_as_owner

        act_as_owner(root)
    options: dict[str, Any] = {"create": False}
    # A read-only dashboard opens the spool read-only where this version can, so it works
    # for a user who may read the spool but not write it.
    if read_only and "read_only" in inspect.signature(Spool.__init__).parameters:
        options["read_only"] = True
    return Spool(root, **options)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    try:
        return socket.create_server((host.strip("[]"), port), family=family, backlog=64)
    except OSError as exc:
        if isinstance(exc, socket.gaierror) or (exc.errno or 0) < 0:
            # The name did not resolve (create_server rewraps getaddrinfo's negative EAI_*
            # code in a plain OSError, printed as "Unknown error -2"): bad input, exit 1.
            raise UsageError(f"--host {host!r} is not an address or a name this machine "
                             "resolves") from None
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise Refused(f"cannot listen on {host}:{port}: {why}") from None


def serve(root: Path | str, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          read_only: bool = False, token: str | None = None, poll: float = 3.0,
          as_json: bool = False) -> int:
    """Serve the dashboard until SIGINT/SIGTERM; refuses an unguarded non-loopback address."""
    token = _check_bind(host, token)
    _need_web_extra()
    import uvicorn

    from jobspool.dashboard.app import create_app

    with _open_spool(root, read_only) as spool:  # a str stays one (a store URL is not a path)
        app = create_app(spool, read_only=read_only, token=token, poll_seconds=poll)
        sock = _listen(host, port)
        bound = sock.getsockname()[1]
        shown = f"[{host.strip('[]')}]" if ":" in host else host
        url = f"http://{shown}:{bound}/"
        where = str(getattr(spool, "display", spool.root))  # a database URL without password
        # The start-up event names the port asked for; with 0 only this one names the port
        # taken (a log reader of `--log-format json` could not find the dashboard).
        from jobspool.logs import CLI_LOGGER

        logging.getLogger(CLI_LOGGER).info(
            "dashboard listening on %s", url,
            extra={"fields": {"event": "listening", "url": url, "port": bound}})
        if as_json:
            sys.stdout.write(orjson.dumps({"url": url, "root": where,
                                           "read_only": read_only,
                                           "token_required": token is not None}).decode() + "\n")
        else:
            sys.stdout.write(f"jobspool dashboard for {where}: {url}"
                             f"{' (read-only)' if read_only else ''}"
                             f"{' (token required)' if token else ''} — Ctrl-C stops it\n")
        sys.stdout.flush()
        # log_config=None: uvicorn's records go through the command's own handler (so with
        # `--log-format json` they are JSON lines too) instead of handlers of its own.
        # proxy_headers=False: uvicorn's default took the client's address from an
        # `X-Forwarded-For` any loopback client (an SSH tunnel's, a local script) could
        # write, and the token throttle counted guesses per made-up address: unlimited
        # guessing, or a chosen address locked out (a probe).
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False,
                                lifespan="on", server_header=False, timeout_graceful_shutdown=2,
                                proxy_headers=False)
        # uvicorn raises the signal that stopped it again once it is done, with the handler
        # it found: SIG_DFL for SIGTERM, so a normal stop (systemd, docker stop) showed as
        # a death by signal (143). Handlers of ours are found instead: a stop is success.
        stopped = {sig: signal.signal(sig, lambda *_: None)
                   for sig in (signal.SIGTERM, signal.SIGINT)}
        quiet = _CutAtShutdown()
        uv_log = logging.getLogger("uvicorn.error")
        uv_log.addFilter(quiet)
        try:
            uvicorn.Server(config).run(sockets=[sock])
        finally:
            uv_log.removeFilter(quiet)
            for sig, previous in stopped.items():
                signal.signal(sig, previous)
    return EXIT_OK


class _CutAtShutdown(logging.Filter):
    """A request still open when a stop's grace ran out is cancelled, and uvicorn logged it
    as "Exception in ASGI application" with three chained tracebacks (57 lines for one
    slow client). Its own one line ("Cancel 1 running task(s), timeout graceful shutdown
    exceeded") says it; the tracebacks go."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not _cancelled(exc)


def _cancelled(exc: BaseException) -> bool:
    """Whether a cancellation ended it: the exception itself, one in a group, or one it was
    raised from or while handling."""
    import asyncio

    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, asyncio.CancelledError):
            return True
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return False


def add_demo_options(sub: Any) -> None:
    """`demo --dashboard`: after the batch, leave the dashboard running on the demo's spool."""
    demo = sub.choices.get("demo")
    if demo is None:
        return
    demo.add_argument("--dashboard", action="store_true",
                      help="after the batch, serve the dashboard on the demo's spool until Ctrl-C")
    add_serve_options(demo, prefix="dashboard-")
    demo.set_defaults(func=_demo_then_dashboard(demo.get_default("func")))


def _demo_then_dashboard(run_demo: Any) -> Any:
    def cmd(args: argparse.Namespace) -> int:
        if not args.dashboard:
            return int(run_demo(args))
        import tempfile

        # Before the batch runs.
        token = _check_bind(args.dashboard_host, args.dashboard_token, "--dashboard-token")
        _need_web_extra()
        root = args.root or os.environ.get("JOBSPOOL_ROOT") or str(
            Path(tempfile.mkdtemp(prefix="jobspool-demo-")) / "spool")
        args.root = root
        code = int(run_demo(args))
        if code != EXIT_OK:
            return code
        return serve(root, host=args.dashboard_host, port=args.dashboard_port,
                     read_only=args.dashboard_read_only, token=token, poll=args.dashboard_poll,
                     as_json=args.json)

    return cmd
