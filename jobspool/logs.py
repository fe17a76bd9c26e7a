"""Logging setup for long-running commands: `--log-format json|text`, `--log-level`.

Events carry the job id, kind, token and state as `extra` fields; the JSON
formatter emits them as keys so a log shipper can index them.

With `--log-format json`, *every* line the command writes to stderr is one
JSON object: log records, Python warnings (captured into logging), the
final summary of `worker` / `run-until-idle` (`summary`, always written,
whatever the level) and a refused command's error line (`error_line`). At
`info`, a worker also logs one start-up line and one line per completed job
(failures are warnings already).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
_EXTRA_KEYS = ("job_id", "kind", "token", "state", "table", "path", "owner")
CLI_LOGGER = "jobspool.cli"

def _timestamp(created: float) -> str:
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
            + f".{int((created % 1) * 1000):03d}Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, any of the known extra keys, and
    the `fields` mapping of a record that has one (start-up lines, summaries)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in _EXTRA_KEYS:
            if key in record.__dict__:
                doc[key] = record.__dict__[key]
        fields = record.__dict__.get("fields")
        if isinstance(fields, dict):
            for key, value in fields.items():
                doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(doc, default=str).decode()


# Control characters but newline and tab (a traceback's lines stay lines).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class TextFormatter(logging.Formatter):
    """Events as text, control characters (but newline and tab) shown as `\\xNN`: a handler's
    error message holding terminal escapes reached the terminal raw (retitling it,
    recoloring what followed), where `list` and `show` escape the same text."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a record is emitted, not when it was set up:
    `main()` may run several times in one process (tests, embedding) with stderr swapped."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging(level: str = "warning", fmt: str = "text") -> None:
    """Configure the root logger for a CLI process (stderr)."""
    if level not in LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LEVELS)}, not {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = _StderrHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
        # A `warnings.warn` would otherwise print two lines of plain text on stderr.
        logging.captureWarnings(True)
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def json_lines(argv: Sequence[str]) -> bool:
    """Whether the command line asks for JSON lines on stderr (read from argv, not from
    `setup_logging`: an error found while parsing it comes first)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--log-format=json" or (arg == "--log-format" and args[i + 1:i + 2] == ["json"]):
            return True
    return False


def _write(level: str, msg: str, fields: dict[str, Any]) -> None:
    doc = {"ts": _timestamp(time.time()), "level": level, "logger": CLI_LOGGER, "msg": msg,
           **fields}
    sys.stderr.write(orjson.dumps(doc, default=str).decode() + "\n")
    sys.stderr.flush()


def startup(command: str, **fields: Any) -> None:
    """The start-up line of a long-running command (info)."""
    from jobspool import __version__
    from jobspool.urls import redact_url

    if isinstance(fields.get("root"), str):
        fields["root"] = redact_url(fields["root"])
    logging.getLogger(CLI_LOGGER).info(
        "%s starting", command,
        extra={"fields": {"event": "start", "command": command, "pid": os.getpid(),
                          "version": __version__, **fields}})


def summary(command: str, doc: dict[str, Any]) -> None:
    """The final summary of a command as one JSON line on stderr, whatever the log level
    (in text mode the summary is printed on stdout as before)."""
    _write("info", f"{command} finished", {"event": "summary", "command": command,
                                           "summary": doc})


def error_line(message: str, code: int) -> None:
    """A failed command's one-line error, as JSON."""
    _write("error", message, {"event": "error", "exit": code})


__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "error_line", "json_lines", "setup_logging",
           "startup", "summary"]
