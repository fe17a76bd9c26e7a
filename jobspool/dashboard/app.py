"""`create_app(spool, ...)`: the dashboard as a Starlette ASGI app (served by `jobspool dashboard`).

The app holds one `Spool` and reads it through the public API from worker
threads (file I/O must not stall the event loop). A background task samples
the workers' published counters for the throughput chart. Pages are Jinja2
templates with autoescape on; a small script polls `/api/overview` and
updates the counts, chart, workers and health in place.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from importlib.resources import files
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio
import orjson
from jinja2 import DictLoader, Environment
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from jobspool.dashboard import security, throttle
from jobspool.dashboard.data import Overview
from jobspool.dashboard.throughput import Throughput
from jobspool.dashboard.web import (
    Dashboard,
    age_text,
)
from jobspool.queue.states import ALL_STATES

if TYPE_CHECKING:
    from jobspool.queue.spool import Spool

def _guard_middleware(dash: Dashboard) -> type[BaseHTTPMiddleware]:
    guard = dash.guard

    class Guarded(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next: RequestResponseEndpoint
                           ) -> Response:
            response = await self._check(request, call_next)
            for name, value in security.SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        async def _check(self, request: Request, call_next: RequestResponseEndpoint
                         ) -> Response:
            host = request.headers.get("host")
            if not security.host_allowed(host, token=guard.token):
                return PlainTextResponse("this dashboard answers only to localhost "
                                         "(start it with a token to serve other names)", 400)
            path = request.url.path
            public = path.startswith("/static/") or path == "/login"
            if not public and not guard.authorized(None,
                                                   request.cookies.get(security.AUTH_COOKIE)):
                refused = self._by_header(request, path)
                if refused is not None:
                    return refused
            if request.method not in ("GET", "HEAD") and not security.same_origin(
                    request.headers.get("origin"), host):
                return PlainTextResponse("cross-origin request refused", 403)
            sid = request.cookies.get(security.SESSION_COOKIE)
            fresh = not sid or len(sid) > 64
            request.state.sid = security.Guard.new_session() if fresh else sid
            response = await call_next(request)
            if fresh:
                response.set_cookie(security.SESSION_COOKIE, request.state.sid, path="/",
                                    httponly=True, samesite="strict")
            return response

        @staticmethod
        def _by_header(request: Request, path: str) -> Response | None:
            """No login cookie: None when a bearer header holds the token, else the answer
            (throttled, or asked for the token). A header is a guess: counted (throttle.py)."""
            auth = request.headers.get("authorization")
            # Only a bearer token is a guess at ours: a proxy's own `Basic` header is not.
            if auth and auth[:7].lower() == "bearer " and guard.token is not None:
                client = security.client_of(request)
                wait = guard.throttle.wait(client)
                if wait > 0:
                    return PlainTextResponse(
                        f"too many wrong tokens from {client}: try again in "
                        f"{throttle.retry_after(wait)} s", 429,
                        headers={"retry-after": throttle.retry_after(wait)})
                if guard.authorized(auth, None):
                    guard.throttle.passed(client)
                    return None
                guard.throttle.failed(client)
            if request.method in ("GET", "HEAD") and not path.startswith("/api/"):
                # The query too: a shared filtered link (?kind=...) keeps its filter.
                query = request.url.query
                back = f"{path}?{query}" if query else path
                return RedirectResponse(f"/login?next={quote(back, safe='/')}",
                                        status_code=303)
            return PlainTextResponse("a token is required", 401,
                                     headers={"www-authenticate": "Bearer"})

    return Guarded


def _bundle(folder: str) -> dict[str, bytes]:
    """Every file of one of the package's asset folders, read once, at import."""
    return {f.name: f.read_bytes() for f in files("jobspool.dashboard").joinpath(folder).iterdir()
            if f.is_file()}


# Templates and static assets are read into memory when the module loads: a dashboard keeps
# serving when its package files change underneath it (an upgrade), or cannot be read any
# more (a server that dropped its rights after start-up, as a read-only user).
_TEMPLATES = {name: data.decode() for name, data in _bundle("templates").items()}
_STATIC = _bundle("static")
_MEDIA = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    data = _STATIC.get(name)
    if data is None:
        return PlainTextResponse("not found", status_code=404)
    media = _MEDIA.get(name[name.rfind("."):], "application/octet-stream")
    return Response(data, media_type=media, headers={"Cache-Control": "max-age=300"})


def create_app(spool: Spool, *, read_only: bool = False, token: str | None = None,
               poll_seconds: float = 3.0, sample_seconds: float = 5.0,
               max_due_age: float = 300.0) -> Starlette:
    """The dashboard for one spool. `token`, when set, is required on every request."""
    from jobspool.dashboard.routes import routes

    env = Environment(loader=DictLoader(_TEMPLATES), autoescape=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["iso"] = _iso
    env.filters["ago"] = _ago
    env.filters["pretty"] = _pretty
    env.globals["states"] = ALL_STATES
    dash = Dashboard(spool=spool, guard=security.Guard(token), read_only=read_only,
                     poll_seconds=poll_seconds, sample_seconds=sample_seconds, env=env,
                     overview=Overview(spool, max_due_age=max_due_age),
                     throughput=Throughput(spool))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_sample_forever, dash)
            yield
            tg.cancel_scope.cancel()

    app = Starlette(routes=[*routes(dash), Route("/static/{name}", _static, name="static")],
                    middleware=[Middleware(_guard_middleware(dash))], lifespan=lifespan)
    app.state.dashboard = dash
    return app


async def _sample_forever(dash: Dashboard) -> None:
    import logging

    log = logging.getLogger("jobspool.dashboard")
    try:
        await anyio.to_thread.run_sync(dash.throughput.backfill)
    except Exception as exc:  # a chart must never take the dashboard down
        log.warning("throughput backfill failed: %s", exc)
    while True:
        try:
            await anyio.to_thread.run_sync(dash.throughput.sample)
        except Exception as exc:
            log.warning("throughput sample failed: %s", exc)
        await anyio.sleep(dash.sample_seconds)


def _iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + \
        time.strftime(" %z", time.localtime(ts))


def _ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "-"
    delta = (time.time() if now is None else now) - ts
    return age_text(abs(delta)) + (" ago" if delta >= 0 else " from now")


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS,
                        default=str).decode()
