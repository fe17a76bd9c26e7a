"""Database URLs shown to people: never with their password."""

from __future__ import annotations

import re

_USERINFO_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*):[^@/?#]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` with its password replaced by `***`, in the `user:pw@` form and as a
    `password=` query parameter (libpq accepts both); the rest is kept, so the URL
    shown still names the spool. Anything that is not a URL comes back unchanged."""
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1:***@", url))


__all__ = ["redact_url"]
