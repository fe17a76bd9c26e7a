"""Database URLs shown to people: never with their password."""

from __future__ import annotations

import re
from urllib.parse import unquote

# Up to the authority's *last* '@': a password with an unencoded '@' ("Tops@cret") was
# cut at the first, and half of it shown.
_USERINFO_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*):[^/?#]*@")
# A password holding an unencoded '/', '?' or '#' as well: the pattern above stopped at it
# and showed all of the password ("app:se/cretword@host"), or took its first letters for
# the password ("p@ss/w?rd#1@host" gave "p", and every "p" of a message was blanked).
# Such a URL (`stray_at`) is shown with everything from the user's ':' to its last '@'
# hidden, or from the scheme when it has no plain user first ("postgresql:///u:pw@h/db").
_USERINFO_TO_LAST_AT = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*):.*@", re.DOTALL)
_ALL_TO_LAST_AT = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://).*@", re.DOTALL)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
# libpq's key=value form ("host=h password=pw" or password='p w').
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` with its password replaced by `***`, in the `user:pw@` form, as a
    `password=` query parameter and in libpq's `password=...` keyword form; the rest is
    kept, so the URL shown still names the spool. Anything else comes back unchanged.
    Whitespace around it is kept, and does not hide the password (the patterns are
    anchored at the scheme: " postgresql://u:pw@h/db" was shown whole)."""
    core = url.strip()
    if core != url:
        lead = url[:len(url) - len(url.lstrip())]
        return lead + redact_url(core) + url[len(url.rstrip()):] if core else url
    if "://" not in url:
        return _KEYWORD_PASSWORD.sub(r"\1***", url)
    if stray_at(url):
        # Misformed: from the scheme to the last '@' may all be the password (a third
        # slash typed, "postgresql:///u:pw@h/db", kept it whole before the pattern).
        shown = _USERINFO_TO_LAST_AT.sub(r"\1:***@", url)
        if shown == url:
            shown = _ALL_TO_LAST_AT.sub(r"\1***@", url)
        return _QUERY_PASSWORD.sub(r"\1***", shown)
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1:***@", url))


def stray_at(url: str) -> bool:
    """Whether an '@' stands where libpq does not read the end of the user and password: a
    second one in the authority, one in the path or after a '#', or one in a query
    parameter before any '='. The password then holds an unencoded '@', '/', '?' or '#'
    (libpq splits at the first '@' or '/', and reads the rest as a host, a database or
    query options it quotes back). An '@' in a query value (`application_name=a@b`) is
    libpq's to read."""
    _scheme, sep, rest = url.partition("://")
    if not sep:
        return False
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    tail = rest[len(authority):]
    tail, _hash, fragment = tail.partition("#")
    path, _q, query = tail.partition("?")
    return (authority.count("@") > 1 or "@" in path or "@" in fragment
            or any("@" in param.split("=", 1)[0] for param in query.split("&")))


def scrub_password(text: str, url: str) -> str:
    """`text` (a driver's error about `url`) without `url`'s password or any piece of it:
    psycopg quotes what it could not parse (`invalid percent-encoded token: "s3cr%t"`) and
    a password holding an unencoded '@' ends up in the host it names."""
    secrets: set[str] = set()
    patterns: tuple[re.Pattern[str], ...] = (
        _ALL_SECRET_TO_LAST_AT if stray_at(url) else _USERINFO_SECRET, _QUERY_SECRET)
    if "://" not in url:
        # The keyword form's `password=...` runs to a space; in a URL's query it took every
        # parameter after the password for a piece of it, and the database, role or host
        # an error named was shown as "***".
        patterns += (_KEYWORD_SECRET,)
    for pattern in patterns:
        for found in pattern.findall(url):
            secret = found.strip("'")
            secrets.add(secret)
            secrets.add(unquote(secret))
            # A password cut by a misparse shows in pieces: each piece long enough to
            # tell goes too (short ones would blank out ordinary words).
            secrets.update(p for p in re.split(r"[@%:/?#&=]", secret) if len(p) >= 4)
    # The URL as typed first, hidden whole, whatever its password's length.
    text = text.replace(url, redact_url(url))
    for secret in sorted((x for x in secrets if x), key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "***")
        else:
            # A password this short is a common word's letters ("x" blanked every x of
            # "cannot execute"): hidden only where it stands as a password, or alone in
            # the quotes of a driver's message ('invalid percent-encoded token: "a%z"').
            esc = re.escape(secret)
            text = re.sub(rf":{esc}@", ":***@", text)
            text = re.sub(rf"(password=){esc}(?=[\s&'\"]|$)", r"\1***", text)
            text = re.sub(rf"([\"']){esc}\1", r"\1***\1", text)
    return text


_USERINFO_SECRET = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*:([^/?#]*)@")
_ALL_SECRET_TO_LAST_AT = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:]*:(.*)@", re.DOTALL)
_QUERY_SECRET = re.compile(r"[?&]password=([^&#]*)", re.IGNORECASE)
_KEYWORD_SECRET = re.compile(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)


_LIBPQ_KEYWORDS = re.compile(
    r"(^|\s)(host|hostaddr|port|dbname|user|password|sslmode|service|passfile)\s*=",
    re.IGNORECASE)


def looks_like_libpq_dsn(text: str) -> bool:
    """Whether `text` is libpq's `key=value` connection string rather than a path."""
    return _LIBPQ_KEYWORDS.search(text) is not None


__all__ = ["looks_like_libpq_dsn", "redact_url", "scrub_password", "stray_at"]
