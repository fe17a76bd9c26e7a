"""What a spool root given as text must not be: a URL of another scheme, a libpq
`key=value` string, a `postgresql:` URL missing its slashes, or a path starting with a `~`
or `$VAR` no shell expanded. Each of those, taken for a directory, became one named after
it (password and all) in the working directory."""

from __future__ import annotations

import os
import re

from jobspool.errors import InvalidRoot
from jobspool.urls import looks_like_libpq_dsn, redact_url

# `Path("postgresql://h/db")` is the relative directory `postgresql:/h/db`: without this check a
# database URL would silently become a file spool in a directory tree named after it.
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")
_BARE_PG_SCHEME = re.compile(r"(postgres(?:ql)?):(?!/)", re.IGNORECASE)


# A path whose first component is `~`/`~user` or a `$VAR`/`${VAR}` left as written.
_UNEXPANDED = re.compile(r"^(~[^/]*|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)(/|$)")


def unexpanded_start(path: str) -> str | None:
    """The `~`, `~user`, `$VAR` or `${VAR}` a path starts with, left as written, or None."""
    found = _UNEXPANDED.match(path)
    return None if found is None else found.group(1)


def refuse_unexpanded(text: str) -> None:
    """`InvalidRoot` when a root given as text starts with a `~` or `$VAR` no shell
    expanded. `Spool(os.environ["JOBSPOOL_ROOT"])` from an env file that kept `~/spool`
    made a directory named `~` in the working directory. Text only: a `Path` has lost the
    `./` of `./~x`, which names that directory on purpose."""
    start = unexpanded_start(text)
    if start is not None:
        shown = redact_url(text)
        raise InvalidRoot(f"spool root {shown!r} starts with {start!r}, which no shell "
                          "expanded: give the path itself (os.path.expanduser, "
                          "os.path.expandvars; ./ before it for a directory named so)",
                          path=shown)


def refuse_url(root: str | os.PathLike[str]) -> None:
    """`SpoolError` when `root` is a URL or a libpq string this store cannot serve. Given
    the caller's own text (`Spool()`), the URL is shown as written: once a `Path`,
    `file:///tmp/x` reads `file:/tmp/x`."""
    text = os.fspath(root)
    shown = redact_url(text)  # never a password in an error
    if looks_like_libpq_dsn(text):
        # Taken for a path it became a directory named after it, password and all.
        raise InvalidRoot(f"spool root {shown!r} looks like a libpq connection string "
                         "(key=value); give the database as a postgresql:// URL",
                         path=shown)
    bare = _BARE_PG_SCHEME.match(text.lstrip())
    if bare is not None:
        # "postgresql:u:pw@host/db", both slashes missing, was taken for a path: a
        # directory named after the URL, password and all, and messages showing it.
        shown = redact_url(f"{bare.group(1).lower()}://{text.lstrip()[bare.end():]}")
        raise InvalidRoot(f"spool root {bare.group(1)}:...: a URL needs two slashes after "
                         f"its scheme ({bare.group(1).lower()}://...; read as {shown!r})",
                         path=shown)
    match = _URL_SCHEME.match(text.lstrip())
    if match is None:
        return
    scheme = match.group()[:-2]
    if text != text.lstrip():
        raise InvalidRoot(f"spool root {shown!r} starts with whitespace before a {scheme}: "
                         "URL; remove it", path=shown)
    if "://" not in text:
        shown = redact_url(text.replace(":/", "://", 1))
        if scheme.lower() in ("postgresql", "postgres"):
            # "write the scheme in lower case" said a URL already in lower case, shown
            # with the slash it lacked already added.
            raise InvalidRoot(f"spool root {shown.replace('://', ':/', 1)!r}: a URL needs "
                             f"two slashes after its scheme, in lower case "
                             f"({scheme.lower()}://...)", path=shown)
    if scheme.lower() in ("postgresql", "postgres"):
        # libpq takes the scheme in lower case only.
        raise InvalidRoot(f"spool root {shown!r}: write the scheme in lower case "
                         f"({scheme.lower()}://)", path=shown)
    raise InvalidRoot(f"spool root {shown!r} is a {scheme}:// URL; a spool is a directory "
                     "or a postgresql:// URL", path=shown)
