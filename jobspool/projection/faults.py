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
    return text[:200] + ("..." if len(text) > 200 else "")


__all__ = ["config_fault", "plain", "storage_fault", "summary"]
