"""Helpers for the spool tests: read the spool directory independently of the implementation.

These look at the disk the way an operator with `ls` and `jq` would, so the
tests check DESIGN §2 (one file per job, named `<id>.json`, in the directory
of its state) without trusting the spool's own readers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson


class FakeClock:
    """A settable clock for every time-dependent rule (leases, backoff, due-ness);
    conftest's `clock` fixture is one of these."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


STATE_DIRS = ("prepared", "ready", "leased", "retryable", "completed", "dead_letter", "canceled")


def job_files(root: Path) -> dict[str, list[str]]:
    """Map each job id found on disk to the state directories holding a file for it."""
    found: dict[str, list[str]] = {}
    for state in STATE_DIRS:
        d = root / state
        if not d.is_dir():
            continue
        for name in os.listdir(d):
            assert name.endswith(".json"), f"{state}/{name} is not named <id>.json"
            found.setdefault(name[: -len(".json")], []).append(state)
    return found


def read_raw(root: Path, state: str, job_id: str) -> dict[str, Any]:
    data = (root / state / f"{job_id}.json").read_bytes()
    raw = orjson.loads(data)
    assert isinstance(raw, dict)
    return raw


def file_bytes(root: Path, job_id: str) -> tuple[str, bytes]:
    """The one state directory holding `job_id` and the exact bytes of its file."""
    where = job_files(root).get(job_id, [])
    assert len(where) == 1, f"job {job_id} is in {where}, expected exactly one directory"
    return where[0], (root / where[0] / f"{job_id}.json").read_bytes()


def tmp_leftovers(root: Path) -> list[str]:
    """Files under tmp/ other than the optional reusable pool tmp/pool/ (DESIGN §2)."""
    tmp = root / "tmp"
    out: list[str] = []
    if not tmp.exists():
        return out
    for dirpath, _dirnames, filenames in os.walk(tmp):
        rel = Path(dirpath).relative_to(tmp)
        if rel.parts[:1] == ("pool",):
            continue
        out.extend(str(rel / f) for f in filenames)
    return out


def all_files(root: Path) -> set[str]:
    """Every file path under root (relative), with the reusable pool's contents excluded."""
    out: set[str] = set()
    for dirpath, _dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel.parts[:2] == ("tmp", "pool"):
            continue
        for f in filenames:
            out.add(str(rel / f))
    return out


def assert_disk_consistent(root: Path, *, ignore: Iterable[str] = ()) -> dict[str, str]:
    """Each job in exactly one state directory, its `state` and `id` fields match; return id->state.

    `ignore` names ids that are known to be unreadable on purpose (corruption tests).
    """
    skip = set(ignore)
    where = job_files(root)
    out: dict[str, str] = {}
    for job_id, states in where.items():
        if job_id in skip:
            continue
        assert len(states) == 1, f"job {job_id} is in several state directories: {states}"
        raw = read_raw(root, states[0], job_id)
        assert raw.get("state") == states[0], (
            f"{states[0]}/{job_id}.json has state field {raw.get('state')!r}"
        )
        assert raw.get("id") == job_id, f"{states[0]}/{job_id}.json has id {raw.get('id')!r}"
        out[job_id] = states[0]
    assert tmp_leftovers(root) == [], f"leftover staging files: {tmp_leftovers(root)}"
    return out


def disk_counts(root: Path) -> dict[str, int]:
    counts = dict.fromkeys(STATE_DIRS, 0)
    for states in job_files(root).values():
        for s in states:
            counts[s] += 1
    return counts


def stat_counts(stats: Any) -> dict[str, int]:
    """Counts per state from a `Stats` object, whatever the exact shape the spool chose."""
    counts = getattr(stats, "counts", None)
    if counts is None and isinstance(stats, Mapping):
        counts = stats.get("counts", stats)
    if isinstance(counts, Mapping):
        by_name = {str(k): int(v) for k, v in counts.items()}
        return {s: by_name.get(s, 0) for s in STATE_DIRS}
    return {s: int(getattr(stats, s)) for s in STATE_DIRS}


def state_of(job: Any) -> str:
    return str(job.state)
