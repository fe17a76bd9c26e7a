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
# Then the password runs to the string's last '@'; hiding more than the password (an '@'
# in a query value) only hides more.
_USERINFO_TO_LAST_AT = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*):.*@", re.DOTALL)
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
    userinfo = _USERINFO_TO_LAST_AT if stray_at(url) else _USERINFO_PASSWORD
    return _QUERY_PASSWORD.sub(r"\1***", userinfo.sub(r"\1:***@", url))


def stray_at(url: str) -> bool:
    """Whether an '@' stands where libpq does not read the user and password: a second one
    in the authority, or any past the first '/', '?' or '#' after it. The password
    then holds an unencoded '@', '/', '?' or '#' (libpq splits at the first '@' or '/',
    and tries the rest as a host)."""
    _scheme, sep, rest = url.partition("://")
    if not sep:
        return False
    parts = re.split(r"[/?#]", rest, maxsplit=1)
    return parts[0].count("@") > 1 or (len(parts) > 1 and "@" in parts[1])


def scrub_password(text: str, url: str) -> str:
    """`text` (a driver's error about `url`) without `url`'s password or any piece of it:
    psycopg quotes what it could not parse (`invalid percent-encoded token: "s3cr%t"`) and
    a password holding an unencoded '@' ends up in the host it names."""
    secrets: set[str] = set()
    patterns = (_USERINFO_SECRET_TO_LAST_AT if stray_at(url) else _USERINFO_SECRET,
                _QUERY_SECRET, _KEYWORD_SECRET)
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
            # "cannot execute"): hidden only where it stands as a password.
            text = re.sub(rf"(:){re.escape(secret)}(@)|(password=){re.escape(secret)}\b",
                          lambda m: f"{m.group(1) or m.group(3)}***{m.group(2) or ''}", text)
    return text


_USERINFO_SECRET = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*:([^/?#]*)@")
_USERINFO_SECRET_TO_LAST_AT = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*:(.*)@",
                                         re.DOTALL)
_QUERY_SECRET = re.compile(r"[?&]password=([^&#]*)", re.IGNORECASE)
_KEYWORD_SECRET = re.compile(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)


_LIBPQ_KEYWORDS = re.compile(
    r"(^|\s)(host|hostaddr|port|dbname|user|password|sslmode|service|passfile)\s*=",
    re.IGNORECASE)


def looks_like_libpq_dsn(text: str) -> bool:
    """Whether `text` is libpq's `key=value` connection string rather than a path."""
    return _LIBPQ_KEYWORDS.search(text) is not None


__all__ = ["looks_like_libpq_dsn", "redact_url", "scrub_password", "stray_at"]
