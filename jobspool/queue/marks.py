"""Where a file spool keeps the last fired tick of each schedule: `<root>/schedules.json`.

Read and rewritten under the spool lock (`Spool.schedule_marks`), so any number of
workers may fire the same schedules. The PostgreSQL store keeps the same marks in a
table instead (`jobspool.pg.marks`), shared by every machine.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson

from jobspool.queue.store import write_atomic

log = logging.getLogger("jobspool.schedules")

MARKS_FILE = "schedules.json"


def read_marks(root: Path) -> dict[str, int]:
    """The last tick fired per schedule name (empty when none fired yet or unreadable)."""
    try:
        doc = orjson.loads((root / MARKS_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        log.warning("ignoring unreadable %s: %s", root / MARKS_FILE, exc)
        return {}
    marks = doc.get("last_tick") if isinstance(doc, dict) else None
    if not isinstance(marks, dict):
        return {}
    return {k: v for k, v in marks.items() if isinstance(k, str) and isinstance(v, int)
            and not isinstance(v, bool)}


def write_marks(root: Path, marks: dict[str, int], *, durable: bool, mode: int) -> None:
    doc = {"v": 1, "last_tick": dict(sorted(marks.items()))}
    write_atomic(root / MARKS_FILE, orjson.dumps(doc, option=orjson.OPT_INDENT_2),
                 durable=durable, mode=mode)
