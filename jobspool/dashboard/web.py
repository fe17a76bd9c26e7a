"""What every dashboard request handler shares: the `Dashboard` record and small helpers
(responses, redirects, forms, threads, ages). Both the app factory (`app.py`) and the
routes (`routes.py`) import it; it imports neither, so they do not import each other."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import anyio
import orjson
from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from jobspool.dashboard import security
from jobspool.dashboard.data import Overview
from jobspool.dashboard.throughput import Throughput
from jobspool.errors import json_safe, undecodable_escaped

if TYPE_CHECKING:
    from jobspool.queue.spool import Spool

NOTICE_COOKIE = "jobspool_notice"
MAX_FORM_BYTES = 16 * 1024


@dataclass
class Dashboard:
    """What every request handler needs: the spool, the switches, the caches."""

    spool: Spool
    guard: security.Guard
    read_only: bool
    poll_seconds: float
    sample_seconds: float
    env: Environment
    overview: Overview
    throughput: Throughput
    _cached: tuple[float, dict[str, Any]] | None = field(default=None, repr=False)
    _computing: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, Any]:
        """The overview document, recomputed at most once a second (many tabs, one cost),
        and by one request at a time: the others wait for it and share its result. On a
        big spool one computation took seconds, and each request of several tabs made its
        own: they piled up (six at once took 13 s each) and memory grew with them. A
        result stays fresh as long as it took to compute, so a slow spool is not read back
        to back — up to `FRESH_AT_MOST`: one that took 50 s (waiting for a held spool lock)
        was served, frozen, for the next 50 s."""
        cached = self._cached
        if cached is not None and time.monotonic() < cached[0]:
            return cached[1]
        with self._computing:
            cached = self._cached
            if cached is not None and time.monotonic() < cached[0]:
                return cached[1]  # computed while this request waited
            began = time.monotonic()
            doc = self.overview.snapshot(self.throughput.series())
            doc["read_only"] = self.read_only
            took = time.monotonic() - began
            self._cached = (time.monotonic() + min(max(1.0, took), FRESH_AT_MOST), doc)
            return doc

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> HTMLResponse:
        notice = request.cookies.get(NOTICE_COOKIE)
        page = self.env.get_template(template).render(
            read_only=self.read_only, csrf=self.guard.csrf_for(request.state.sid),
            csrf_field=security.CSRF_FIELD, poll_ms=int(self.poll_seconds * 1000),
            token_required=self.guard.token is not None, path=request.url.path,
            here=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            notice=unquote(notice)[:300] if notice else None, **context)
        try:
            response = HTMLResponse(page, status_code=status)
        except UnicodeEncodeError:
            # A file name that is not UTF-8 (`ready/bad\xffname.json`, read back with lone
            # surrogates) took down the overview exactly when health had it to report.
            response = HTMLResponse(undecodable_escaped(page), status_code=status)
        if notice:
            response.delete_cookie(NOTICE_COOKIE, path="/")
        return response


# The longest an overview document is served again without being recomputed (seconds).
FRESH_AT_MOST = 10.0


def json_response(doc: Any, status: int = 200) -> Response:
    """A JSON response encoded with orjson (datetimes and the like as strings)."""
    try:
        body = orjson.dumps(doc, default=str)
    except TypeError:  # a file name that is not UTF-8, as in `render`
        body = orjson.dumps(json_safe(doc), default=str)
    return Response(body, status_code=status, media_type="application/json")


NOTICE_CHARS = 1000


def redirect(to: str, notice: str | None = None) -> RedirectResponse:
    """A 303 to a local path, carrying a one-shot notice in a cookie (never in the URL)."""
    response = RedirectResponse(safe_next(to), status_code=303)
    if notice:
        # Whole where it can be (a refusal's remedy comes last: cut at 300 characters, the
        # restore of a damaged file lost it); bounded so the cookie, quoted, stays < 4 KB.
        if len(notice) > NOTICE_CHARS:
            notice = notice[:NOTICE_CHARS - 1].rstrip() + "…"
        response.set_cookie(NOTICE_COOKIE, quote(notice), path="/", httponly=True,
                            samesite="strict")
    return response


def safe_next(target: str | None) -> str:
    """Only a local path: `//evil.example` and absolute URLs would make an open redirect."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


async def read_form(request: Request) -> dict[str, str]:
    """A small urlencoded form (the dashboard posts nothing else); oversize is refused."""
    from urllib.parse import parse_qs

    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormTooLarge
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items()}


class FormTooLarge(Exception):
    """Raised when a POST body is larger than any form the dashboard sends."""


def in_thread(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run blocking spool I/O off the event loop."""
    return anyio.to_thread.run_sync(lambda: fn(*args))


def age_text(seconds: float | None) -> str:
    """12 s, 4 min, 3.2 h, 2.0 d."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
