"""Whether a projection write failed for its storage or for its rows.

Storage: the table's directory read-only, full, not permitted, an I/O error, a damaged
data or manifest file, an object store that did not answer. None of it is the job's
doing, and retrying it on the job's attempts dead-lettered every job that wrote the
projection within seconds (about fifteen, on the default backoff) while the spool was
fine. Rows: a schema or type LanceDB refuses — the job's own, on its attempts.

LanceDB raises its storage errors as `RuntimeError("lance error: LanceError(IO): ...
(os error 30) ..., /root/.cargo/registry/...")`: told apart by that text. `plain` drops
the Rust source paths such messages end with, which say nothing to an operator.
"""

from __future__ import annotations

import re

_RUST_PATH = re.compile(r",?\s*(?:/[^\s,]*?)?/(?:\.cargo/registry|rustc)/[^\s,)]*")
_OS_ERROR = re.compile(r"\(os error \d+\)")
# The same errors in Rust's debug form: LanceDB's connect (an object store refusing or
# not answering: `ValueError("Invalid input, Failed to connect to namespace: IO { source:
# Generic { store: "S3", ... Os { code: 111, kind: ConnectionRefused ...`).
_DEBUG_FORM = re.compile(r"\bIO \{ source:|\bGeneric \{ store:|\bOs \{ code: \d+")
# A file of the table gone under an open handle (its `_versions/` or the whole table
# removed by hand while a worker ran): charged to the next job as its failure, where the
# retry of a deferral opens the table afresh (made anew, or refused as damaged).
_NOT_FOUND = re.compile(r"lance error: Not found: ")


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in out and len(out) < 8:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


def storage_fault(exc: BaseException | str) -> bool:
    """Whether `exc` (or what caused it) is the projection's storage failing."""
    for e in ([exc] if isinstance(exc, str) else _chain(exc)):
        if isinstance(e, OSError):
            return True
        text = e if isinstance(e, str) else str(e)
        if "LanceError(IO)" in text or _OS_ERROR.search(text) or _DEBUG_FORM.search(text) \
                or _NOT_FOUND.search(text):
            return True
    return False


def config_fault(exc: BaseException) -> bool:
    """Whether LanceDB refused the storage's URI or options themselves, before any I/O: a
    `ValueError("Invalid input, ...")` that is no storage fault (`az://c/x` without an
    account name, `oss://` without an endpoint), or an option that does not parse
    (`Generic Config error: failed to parse "maybe" as boolean`). Retrying cannot cure
    it: every job was charged an attempt until the queue was dead-lettered."""
    for e in _chain(exc):
        if "Config error" in str(e):
            return True
    return isinstance(exc, ValueError) and not storage_fault(exc)


def plain(text: str) -> str:
    """`text` without the Rust source locations LanceDB appends to its errors."""
    return _RUST_PATH.sub("", text)


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line of at most about `limit` characters: each word (a path, a URL)
    longer than 80 characters cut in its middle first, then the line. A long path used up
    the line, and the cause beside it (File name too long) was cut off."""
    text = " ".join(plain(text).split())
    text = _LONG_WORD.sub(lambda m: f"{m.group()[:30]}...{m.group()[-40:]}", text)
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


_LONG_WORD = re.compile(r"\S{81,}")
_KIND = re.compile(r"\bkind: (\w+)")
_STATUS = re.compile(r"\b(?:status(?: code)?:? ?|HTTP )(\d{3})\b")
_WORDS = re.compile(r"(?<=[a-z])(?=[A-Z])")


def summary(exc: BaseException) -> str:
    """A storage fault in a few words for one line: what LanceDB says in Rust's debug form
    (800 characters of nested structs) cut to its cause where one is named (`connection
    refused`, `HTTP 403`), else its first 200 characters without source paths."""
    text = " ".join(plain(str(exc)).split()).removeprefix("Invalid input, ")
    found = [m.group(1) for m in _KIND.finditer(text) if m.group(1) != "Other"]
    status = _STATUS.search(text)
    if status is not None:
        return f"HTTP {status.group(1)}"
    if found:
        return _WORDS.sub(" ", found[-1]).lower()
    return one_line(text, 200)


__all__ = ["config_fault", "one_line", "plain", "storage_fault", "summary"]
