"""Who may look and who may act: the token, the CSRF check, the host check, safe headers.

The threats, and what answers each:

- Someone else on the network. The server binds 127.0.0.1 unless told
  otherwise, and refuses any other address without a token
  (`check_bind`). With a token, every request needs it: a bearer header
  (`Authorization: Bearer ...`, for scripts) or the cookie the login form
  sets. The cookie holds an HMAC of the token under a per-process secret,
  never the token, and is `HttpOnly; SameSite=Strict`. Wrong tokens from
  one address are throttled (`throttle.py`): a short token cannot be guessed.
- A web page the operator visits that posts to the dashboard (CSRF). Every
  POST carries a token bound to the browser's session cookie
  (HMAC(secret, session id)); it is checked in constant time, and a POST
  whose `Origin` names another site is refused too. No action is reachable
  by GET.
- DNS rebinding (a hostile name resolving to 127.0.0.1 so a page can read a
  tokenless dashboard): without a token only loopback `Host` headers are
  answered.
- A payload or error holding markup. Templates autoescape everything, the
  polling script writes `textContent` only, and the Content-Security-Policy
  allows scripts from the dashboard's own `/static/` alone, so even a
  mistake in escaping would not run an injected script.

Not covered: TLS. A token sent over plain HTTP to a non-loopback address
can be sniffed; put the dashboard behind a TLS proxy or an SSH tunnel.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from typing import Any
from urllib.parse import urlsplit

from jobspool.dashboard.throttle import Throttle

SESSION_COOKIE = "jobspool_sid"
AUTH_COOKIE = "jobspool_auth"
CSRF_FIELD = "csrf"
TOKEN_ENV = "JOBSPOOL_DASHBOARD_TOKEN"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})

SECURITY_HEADERS = {
    "content-security-policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # not no-referrer: under it Chromium sends `Origin: null` with form posts, which the
    # origin check must refuse (sandboxed frames send it too)
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class BindRefused(ValueError):
    """Raised when asked to serve on a non-loopback address without a token."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and the name localhost."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind address unless a token guards it, and a token no client
    could send: blank, or holding a control character (a newline cannot travel in a
    header), or spaces at its ends (a login form's or header's trimming loses them)."""
    if token and (not token.strip() or token != token.strip()
                  or any(not ch.isprintable() for ch in token)):
        raise BindRefused("the dashboard token must be printable, without control "
                          "characters or spaces at its ends (no client could send it as "
                          "given); generate one with: python -c 'import secrets; "
                          "print(secrets.token_urlsafe(24))'")
    if not is_loopback(host) and not token:
        raise BindRefused(
            f"refusing to serve the dashboard on {host!r} without a token: anyone who can "
            f"reach it could read every payload and error, and requeue or cancel jobs; pass "
            f"--token or set {TOKEN_ENV}, or bind 127.0.0.1")


class Guard:
    """The per-process secrets and the checks the middleware and the forms use."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        self._secret = secrets.token_bytes(32)
        self.throttle = Throttle()  # wrong tokens per client address (throttle.py)

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._secret, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    # ------------------------------------------------------------ sessions and CSRF

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    def csrf_for(self, session: str) -> str:
        return self._mac("csrf", session)

    def csrf_ok(self, session: str | None, sent: str | None) -> bool:
        if not session or not sent:
            return False
        return _same(self.csrf_for(session), sent)

    # ------------------------------------------------------------ the token

    def token_ok(self, sent: str | None) -> bool:
        if self.token is None:
            return True
        if not sent:
            return False
        want = self.token.encode()
        if hmac.compare_digest(_utf8(sent), want):
            return True
        # A header is decoded as latin-1: a non-ASCII token sent by curl (its UTF-8 bytes)
        # arrives as mojibake, and a token a person could log in with locked scripts out.
        try:
            raw = sent.encode("latin-1")
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(raw, want)

    def auth_cookie(self) -> str:
        """What the login form sets: proof of the token, useless to anyone without it."""
        assert self.token is not None
        return self._mac("auth", hashlib.sha256(self.token.encode()).hexdigest())

    def authorized(self, authorization: str | None, cookie: str | None) -> bool:
        if self.token is None:
            return True
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer" and self.token_ok(value.strip()):
                return True
        return bool(cookie) and _same(str(cookie), self.auth_cookie())


def client_of(request: Any) -> str:
    """The address a request came from, as the throttle counts it."""
    client = getattr(request, "client", None)
    return str(client.host) if client is not None and client.host else "unknown"


def _utf8(text: str) -> bytes:
    # Lone surrogates too: whatever a client sent must compare unequal, never raise.
    return text.encode("utf-8", "surrogatepass")


def _same(ours: str, sent: str) -> bool:
    """A constant-time comparison of text a client sent: `compare_digest` on two `str`
    raises TypeError for non-ASCII ones, and `csrf=%C3%A9` or a cookie of one accented
    letter got a 500 and a logged traceback, from anyone who could reach the port."""
    return hmac.compare_digest(_utf8(ours), _utf8(sent))


def host_allowed(host_header: str | None, *, token: str | None) -> bool:
    """Without a token, only loopback names may be in `Host` (defeats DNS rebinding)."""
    if token:
        return True
    if not host_header:
        return False
    host = urlsplit(f"//{host_header}").hostname or ""
    return is_loopback(host)


def same_origin(origin: str | None, host_header: str | None) -> bool:
    """A browser's `Origin` must name this server; no header (curl, old browsers) is allowed."""
    if origin is None:
        return True
    if origin == "null" or not host_header:
        return False
    return urlsplit(origin).netloc.lower() == host_header.lower()
