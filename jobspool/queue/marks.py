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
# A schedule's rule fingerprint is kept beside its mark, under its name plus this ('#' is
# in no schedule name or kind, so it names no other schedule's mark).
RULE_MARK = "#rule"


def read_marks(root: Path, *, rules: bool = False) -> dict[str, int]:
    """The last tick fired per schedule name (empty when none fired yet or unreadable);
    with `rules`, each rule fingerprint too, under its name plus `RULE_MARK` (what a
    scheduler holds and saves back, `write_marks`)."""
    try:
        raw = (root / MARKS_FILE).read_bytes()
        doc = orjson.loads(raw)
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        log.warning("ignoring unreadable %s: %s", root / MARKS_FILE, exc)
        return {}
    section = doc.get("last_tick") if isinstance(doc, dict) else None
    out = _ints(section)
    if not isinstance(section, dict) or len(out) != len(section):
        _said_once(raw, "ignoring %s the schedules' last ticks cannot be read from (%s): "
                   "schedules start afresh (catch_up='all' loses the ticks missed)",
                   root / MARKS_FILE, "no 'last_tick' object" if not isinstance(section, dict)
                   else "a tick that is not an integer")
    if rules and isinstance(doc, dict):
        out.update({k + RULE_MARK: v for k, v in _ints(doc.get("rule")).items()})
    return out


_SAID: set[int] = set()


def _said_once(raw: bytes, message: str, *args: object) -> None:
    """Warn once per process for one content of the file: every scheduler tick reads it,
    and the next fire rewrites it whole."""
    if hash(raw) not in _SAID:
        _SAID.add(hash(raw))
        log.warning(message, *args)


def _ints(section: object) -> dict[str, int]:
    if not isinstance(section, dict):
        return {}
    return {k: v for k, v in section.items() if isinstance(k, str) and isinstance(v, int)
            and not isinstance(v, bool) and -2**63 <= v < 2**63}


def write_marks(root: Path, marks: dict[str, int], *, durable: bool, mode: int) -> None:
    """Save what `read_marks(root, rules=True)` gave (changed): the fingerprints apart."""
    ticks = {k: v for k, v in marks.items() if not k.endswith(RULE_MARK)}
    doc: dict[str, object] = {"v": 1, "last_tick": dict(sorted(ticks.items()))}
    rules = {k.removesuffix(RULE_MARK): v for k, v in marks.items() if k.endswith(RULE_MARK)}
    if rules:
        doc["rule"] = dict(sorted(rules.items()))
    write_atomic(root / MARKS_FILE, orjson.dumps(doc, option=orjson.OPT_INDENT_2),
                 durable=durable, mode=mode)
