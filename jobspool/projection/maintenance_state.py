"""The maintenance records: what a run did per table, and the state file health reads.

`<uri>/.jobspool-maintenance.json` (local URIs; object storage keeps it in
this process's memory, so a long-lived worker still resumes where its last
run stopped) keeps, per table, the
outcome of the last run, the time of the first attempt and of the last
success, and the count of consecutive failures, plus where the next run
resumes. `jobspool health` reads it (`read_maintenance_state`) without
loading LanceDB or pyarrow; `maintain` writes it after every run.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from jobspool.projection.handler import _one_line

log = logging.getLogger("jobspool.projection.maintenance")

Outcome = Literal["optimized", "deferred", "skipped", "failed"]
STATE_FILE = ".jobspool-maintenance.json"
STATE_LOCK = ".jobspool-maintenance.lock"
STATE_FORMAT = 1
# The state of object-storage projections (no local file to keep it in), by URI.
_MEMORY: dict[str, dict[str, Any]] = {}
_MEMORY_LOCK = threading.Lock()


# --- reports


@dataclass(frozen=True)
class TableOutcome:
    """What maintenance did to one table, and why."""

    table: str
    outcome: Outcome
    reason: str
    seconds: float = 0.0
    version_before: int | None = None
    version_after: int | None = None
    tombstones_removed: int = 0
    indexed: bool = False


@dataclass(frozen=True)
class MaintenanceReport:
    """The outcome of one maintenance run, per table, and where the next run resumes."""

    tables: tuple[TableOutcome, ...]
    resume_at: str | None
    seconds: float
    canceled: bool = False

    def __getitem__(self, table: str) -> TableOutcome:
        for t in self.tables:
            if t.table == table:
                return t
        raise KeyError(table)

    def counts(self) -> dict[str, int]:
        """Number of tables per outcome."""
        out: dict[str, int] = {}
        for t in self.tables:
            out[t.outcome] = out.get(t.outcome, 0) + 1
        return out

    @property
    def ok(self) -> bool:
        """True when no table failed (deferred and skipped tables are fine)."""
        return all(t.outcome != "failed" for t in self.tables)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (`jobspool maintain --json`)."""
        return {
            "tables": [asdict(t) for t in self.tables],
            "resume_at": self.resume_at,
            "seconds": self.seconds,
            "canceled": self.canceled,
            "counts": self.counts(),
            "ok": self.ok,
        }


# --- persisted state


def state_path(uri: str | None) -> Path | None:
    """The maintenance state file for a database URI (None for remote URIs)."""
    if uri is None:
        return None
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    elif "://" in uri:
        return None
    return Path(uri) / STATE_FILE


def read_maintenance_state(uri: str | os.PathLike[str]) -> dict[str, Any]:
    """Read the persisted maintenance state: `{"tables": {name: {...}}, "resume_at": ...}`.

    Per table: `first_attempt`, `last_success` and `last_attempt` (epoch
    seconds or None),
    `last_outcome`, `last_reason`, `consecutive_failures`, `version_after`.
    A missing or unreadable file reads as empty state (never raises).
    """
    path = state_path(os.fspath(uri))
    empty: dict[str, Any] = {"format": STATE_FORMAT, "tables": {}, "resume_at": None}
    if path is None:
        with _MEMORY_LOCK:
            return copy.deepcopy(_MEMORY.get(os.fspath(uri), empty))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return empty
    if not isinstance(data, dict) or not isinstance(data.get("tables"), dict):
        return empty
    data.setdefault("resume_at", None)
    return data


def _save_state(
    uri: str | None,
    outcomes: Sequence[TableOutcome],
    resume_at: str | None,
    now: float,
    *,
    touch_resume: bool,
    known: set[str] | None = None,
) -> None:
    """Merge a run's outcomes into the state; `known`, after a full run, are the tables that
    exist (entries of any other are dropped)."""
    path = state_path(uri)
    if path is None:
        if uri is not None:
            with _MEMORY_LOCK:
                state = _MEMORY.setdefault(uri, {"format": STATE_FORMAT, "tables": {}, "resume_at": None})
                _merge_state(state, outcomes, resume_at, now, touch_resume=touch_resume,
                             known=known)
        return
    if not path.parent.is_dir():
        return  # no projection there (nothing was maintained): never create one
    import portalocker

    try:
        # Read-modify-write under a lock: two processes' beats may finish at
        # once. The file is advisory (health reporting, where to resume), so
        # it is replaced atomically but not fsynced.
        mode = _mode_for(path.parent)
        lock_path = path.parent / STATE_LOCK
        with portalocker.Lock(str(lock_path), mode="a", timeout=10):
            _chmod_own(lock_path, mode)
            state = read_maintenance_state(str(path.parent))
            _merge_state(state, outcomes, resume_at, now, touch_resume=touch_resume,
                         known=known)
            tmp = path.with_name(f"{STATE_FILE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
            os.chmod(tmp, mode)
            os.replace(tmp, path)
    except (OSError, portalocker.LockException) as exc:
        log.warning("could not save maintenance state to %s: %s", path, _one_line(exc))


def _mode_for(directory: Path) -> int:
    """The mode of jobspool's files in a projection directory, whatever the umask: read and
    write for whom the directory lets in, never others (a private spool's index/ is 0700:
    its files 0600; a group spool's 2770: 0660)."""
    try:
        return (os.stat(directory).st_mode & 0o660) | 0o600
    except OSError:
        return 0o600


def _chmod_own(path: Path, mode: int) -> None:
    try:
        if os.stat(path).st_uid == os.geteuid():
            os.chmod(path, mode)
    except OSError:
        pass  # advisory: another user's lock file keeps its mode


def _merge_state(state: dict[str, Any], outcomes: Sequence[TableOutcome], resume_at: str | None,
                 now: float, *, touch_resume: bool, known: set[str] | None = None) -> None:
    tables: dict[str, Any] = state["tables"]
    if known is not None:
        for gone in set(tables) - known:
            del tables[gone]
    for o in outcomes:
        entry = tables.setdefault(
            o.table, {"last_success": None, "consecutive_failures": 0, "version_after": None}
        )
        # health measures staleness from here while nothing has succeeded
        # yet; an entry from an older state file starts its clock now.
        entry.setdefault("first_attempt", now)
        entry["last_attempt"] = now
        entry["last_outcome"] = o.outcome
        entry["last_reason"] = o.reason
        if o.outcome == "optimized":
            entry["last_success"] = now
            entry["consecutive_failures"] = 0
            entry["version_after"] = o.version_after
        elif o.outcome == "failed":
            entry["consecutive_failures"] = int(entry.get("consecutive_failures", 0)) + 1
    if touch_resume:
        state["resume_at"] = resume_at
    state["format"] = STATE_FORMAT
    state["updated_at"] = now


__all__ = [
    "STATE_FILE",
    "STATE_FORMAT",
    "STATE_LOCK",
    "MaintenanceReport",
    "Outcome",
    "TableOutcome",
    "read_maintenance_state",
    "state_path",
]
