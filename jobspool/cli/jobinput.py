"""Reading what `enqueue` is given on the command line: the payload (PAYLOAD_JSON or
stdin, bounded by the spool's size limit) and `--run-at`.

The checks are the API's: a value this module lets through is validated by
`Spool.enqueue` with the message the API gives (DESIGN §9).
"""

from __future__ import annotations

import sys
from typing import Any

from jobspool.cli.common import UsageError

# How much more than the stored job's limit stdin may hold: JSON as people pipe it
# (`jq .`, indented by hand) is often three times its compact size, and stdin was refused
# as over max_job_bytes where the same text given as PAYLOAD_JSON fitted.
STDIN_SLACK = 16
STDIN_CAP = 64 * 1024 * 1024


def _read_stdin(max_job_bytes: int) -> str:
    """Stdin as text (bytes that are not UTF-8 kept as lone surrogates, which
    `_read_payload` names), read up to `STDIN_SLACK` times the spool's limit (the stored,
    compact job is checked against the limit itself afterwards); more is refused as soon
    as it is read. Reading it all first held an endless or huge stream (`yes |`, a log
    piped by mistake) in memory, only to refuse it as too large afterwards."""
    stdin = sys.stdin
    if stdin is None:  # closed (`<&-`), as some daemons and supervisors leave it
        raise UsageError("PAYLOAD_JSON is '-' but stdin is closed: pipe the payload in, "
                         "or give it as an argument")
    limit = min(max_job_bytes * STDIN_SLACK, max(max_job_bytes, STDIN_CAP))
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        data: bytes = buffer.read(limit + 1)
        over = len(data) > limit
        text = data.decode("utf-8", "surrogateescape")
    else:  # a text-only stdin (an embedding caller's StringIO): count its UTF-8 bytes
        text = stdin.read(limit + 1)
        over = len(text.encode("utf-8", "surrogateescape")) > limit
    if over:
        raise UsageError(f"payload from stdin is over {limit} bytes, more than any job "
                         f"under the spool's max_job_bytes={max_job_bytes} could be even "
                         f"indented (stopped reading at {limit + 1})")
    return text


def _read_payload(text: str | None, *, stdin_limit: int | None = None) -> Any:
    """Parse PAYLOAD_JSON, or stdin for `-` (read up to `stdin_limit` bytes). The parser is
    lenient on purpose (NaN, Infinity, 1e999, huge integers, lone surrogates are read), so
    that the API's payload rule refuses them with the very message `Spool.enqueue` gives:
    one rule for API and CLI (DESIGN §9)."""
    import json

    from jobspool.queue.payload import MAX_JOB_BYTES_LIMIT, MAX_JSON_DEPTH

    if text is None:
        return None
    # With no spool's limit given, the largest any spool may have.
    limit = MAX_JOB_BYTES_LIMIT if stdin_limit is None else stdin_limit
    raw = _read_stdin(limit) if text == "-" else text
    where = "stdin" if text == "-" else "PAYLOAD_JSON"
    if not raw.isascii():
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, kept as lone surrogates
            raise UsageError(f"payload from {where} is not valid UTF-8") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        hint = ""
        if exc.msg == "Extra data" and "\n" in raw[:exc.pos]:
            # JSON Lines piped in, one payload per line: each would be a job, but enqueue
            # makes one. Said plainly rather than as a parser position.
            hint = ("; it holds more than one JSON document (JSON Lines?): enqueue adds one "
                    "job per call (a loop, or Spool.enqueue_many for many)")
        raise UsageError(f"payload from {where} is not valid JSON: {exc}{hint}") from None
    except RecursionError:
        raise UsageError(f"payload from {where} is nested deeper than {MAX_JSON_DEPTH} "
                         "levels, which JSON readers refuse") from None
    except ValueError:  # Python's limit on integer digits (4300): far past 64 bits
        raise UsageError(f"payload from {where} holds an integer outside the 64-bit range "
                         "JSON readers support") from None


def _run_at(text: str | None) -> Any:
    """`--run-at`: epoch seconds or an ISO 8601 time with a zone (`2026-12-01T09:00:00Z`);
    the API validates the value (finite, aware, not far in the past)."""
    if text is None:
        return None
    from datetime import datetime

    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--run-at {text!r} is neither epoch seconds nor an ISO 8601 time "
                         "(e.g. 2026-12-01T09:00:00Z)") from None
    if when.tzinfo is None:  # the API's message speaks of tzinfo=; a shell user adds a zone
        raise UsageError(f"--run-at {text!r} has no time zone: end it with Z (UTC) or an "
                         "offset such as +02:00")
    return when
