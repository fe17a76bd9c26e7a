"""Logging setup for long-running commands: `--log-format json|text`, `--log-level`.

Events carry the job id, kind, token and state as `extra` fields; the JSON
formatter emits them as keys so a log shipper can index them.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
_EXTRA_KEYS = ("job_id", "kind", "token", "state", "table", "path", "owner")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any of the known extra keys."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in _EXTRA_KEYS:
            if key in record.__dict__:
                doc[key] = record.__dict__[key]
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def setup_logging(level: str = "warning", fmt: str = "text") -> None:
    """Configure the root logger for a CLI process (stderr)."""
    if level not in LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LEVELS)}, not {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
