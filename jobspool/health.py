"""`check_health(spool)`: an `ok` / `degraded` verdict with reasons an operator can act on.

`jobspool health` prints it and exits 0 when ok, 2 when degraded, so a cron
job, a container healthcheck or a monitoring probe can use the exit code
alone. Each reason has a stable `code` (for alert rules), a `message` that
names what to look at and the command that helps, and the `value` that
tripped it.

| code                    | degraded when                                                  |
|-------------------------|----------------------------------------------------------------|
| `dead_letters`          | any job is in `dead_letter/`                                   |
| `queue_not_draining`    | the oldest due job has waited more than `max_due_age`          |
| `expired_leases`        | a lease expired (plus `lease_grace`) and nothing reclaimed it  |
| `stale_prepared`        | a prepared job is older than `prepare_grace_seconds`           |
| `quarantined_files`     | `quarantine/` holds files                                      |
| `maintenance_stale`     | a projection table has not been maintained successfully for    |
|                         | 3x `maintenance_cadence` although maintenance was attempted    |
| `maintenance_failing`   | a table's optimize failed `max_maintenance_failures` times in  |
|                         | a row (lost commit races are `deferred`, never counted)        |

Cost: one listing of every state directory (`Spool.stats`), plus reading the
files of `leased/` and `prepared/` (both small in a healthy spool: bounded
by worker concurrency and by in-flight two-phase producers), plus the
projection's maintenance state file. Nothing is written.

Time: spool rules use the spool's clock (`spool.now()`). Maintenance
timestamps are wall-clock seconds written by `maintain`; they are compared
with the same `spool.now()`, which is the wall clock unless a test injects
another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobspool.queue.states import JobState

if TYPE_CHECKING:
    from jobspool.queue.spool import Spool

DEFAULT_MAX_DUE_AGE = 300.0
DEFAULT_MAINTENANCE_CADENCE = 60.0  # MaintenanceBeat's default interval
DEFAULT_MAX_MAINTENANCE_FAILURES = 3
STALE_FACTOR = 3.0
_EXAMPLES = 3  # job ids / tables named in a message

# Outcomes that count as "maintenance is doing its job" besides `optimized`:
# nothing changed since the last success, or the table is gone.
_FINE_SKIPS = ("unchanged since", "table does not exist")


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason a spool is degraded: a stable code, what to look at, and the value seen."""

    code: str
    message: str
    value: float | int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "value": self.value}


@dataclass(frozen=True)
class Health:
    """The verdict of `check_health`: `ok` when there are no reasons."""

    reasons: list[Reason] = field(default_factory=list)
    root: str = ""
    checked_at: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def status(self) -> str:
        return "ok" if self.ok else "degraded"

    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "ok": self.ok, "root": self.root,
                "checked_at": self.checked_at, "reasons": [r.to_dict() for r in self.reasons],
                "figures": dict(self.figures)}

    def text(self) -> str:
        if self.ok:
            return f"ok: {self.root}"
        lines = [f"degraded: {self.root} ({len(self.reasons)} reason"
                 f"{'s' if len(self.reasons) != 1 else ''})"]
        lines.extend(f"  [{r.code}] {r.message}" for r in self.reasons)
        return "\n".join(lines)


def _ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:_EXAMPLES])
    return shown + (f" and {len(ids) - _EXAMPLES} more" if len(ids) > _EXAMPLES else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def default_projection(spool: Spool) -> str | None:
    """`<root>/index` when that directory exists (where a worker projects by default)."""
    path = Path(spool.root) / "index"
    return str(path) if path.is_dir() else None


def check_health(
    spool: Spool,
    *,
    max_due_age: float = DEFAULT_MAX_DUE_AGE,
    projection: str | os.PathLike[str] | None = None,
    lease_grace: float = 0.0,
    maintenance_cadence: float = DEFAULT_MAINTENANCE_CADENCE,
    max_maintenance_failures: int = DEFAULT_MAX_MAINTENANCE_FAILURES,
) -> Health:
    """Check a spool (and its projection's maintenance) and return the verdict with reasons.

    `projection` is the LanceDB URI whose maintenance state to read; it
    defaults to `<root>/index` when that directory exists. A remote URI has
    no local state file and adds no reasons. `lease_grace` tolerates leases
    that expired that recently (a worker about to reclaim them).
    """
    if not max_due_age > 0:
        raise ValueError(f"max_due_age must be a positive number, not {max_due_age!r}")
    if not maintenance_cadence > 0:
        raise ValueError(f"maintenance_cadence must be a positive number, not "
                         f"{maintenance_cadence!r}")
    if lease_grace < 0:
        raise ValueError(f"lease_grace must not be negative, not {lease_grace!r}")
    if max_maintenance_failures < 1:
        raise ValueError(f"max_maintenance_failures must be at least 1, not "
                         f"{max_maintenance_failures!r}")
    stats = spool.stats()
    now = stats.now
    reasons: list[Reason] = []

    dead = stats.counts.get(JobState.DEAD_LETTER.value, 0)
    if dead:
        reasons.append(Reason(
            "dead_letters",
            f"{_plural(dead, 'dead-lettered job')}: inspect them with `jobspool list --state "
            f"dead_letter` (last_error says why), then `jobspool requeue ID` or `--all-dead`",
            dead))

    age = stats.oldest_due_age
    if age is not None and age > max_due_age:
        reasons.append(Reason(
            "queue_not_draining",
            f"the oldest due job has waited {age:.0f} s (bound {max_due_age:g} s) with "
            f"{stats.due} due: are workers running for its kind? see `jobspool stats --by-kind`",
            round(age, 3)))

    expired = _expired_leases(spool, now - lease_grace)
    if expired:
        reasons.append(Reason(
            "expired_leases",
            f"{_plural(len(expired), 'lease')} expired and not reclaimed ({_ids(expired)}): "
            f"workers died and nothing recovered; run `jobspool recover` or start a worker "
            f"for their kinds",
            len(expired)))

    stuck = _stale_prepared(spool, now - spool.prepare_grace_seconds)
    if stuck:
        reasons.append(Reason(
            "stale_prepared",
            f"{_plural(len(stuck), 'prepared job')} older than the replay grace "
            f"({spool.prepare_grace_seconds:g} s): a producer died between prepare and commit "
            f"({_ids(stuck)}); run `jobspool recover --app MODULE:ATTR` with replay hooks, or "
            f"look at `jobspool list --state prepared`",
            len(stuck)))

    if stats.quarantined:
        reasons.append(Reason(
            "quarantined_files",
            f"{_plural(stats.quarantined, 'unreadable file')} in {spool.root / 'quarantine'}: "
            f"each has a .reason file beside it; repair and re-enqueue, or delete them",
            stats.quarantined))

    uri = os.fspath(projection) if projection is not None else default_projection(spool)
    if uri is not None:
        reasons.extend(_maintenance_reasons(uri, now, maintenance_cadence,
                                            max_maintenance_failures))

    figures = {"counts": dict(stats.counts), "due": stats.due,
               "oldest_due_age": stats.oldest_due_age, "fence": stats.fence,
               "quarantined": stats.quarantined, "expired_leases": len(expired),
               "stale_prepared": len(stuck), "projection": uri}
    return Health(reasons=reasons, root=str(spool.root), checked_at=now, figures=figures)


def _expired_leases(spool: Spool, cutoff: float) -> list[str]:
    """Leased jobs whose lease expired at or before `cutoff` (file reads of `leased/`)."""
    out: list[str] = []
    for job in spool.jobs(JobState.LEASED):
        if job.lease is not None and job.lease.expires_at <= cutoff:
            out.append(job.id)
    return out


def _stale_prepared(spool: Spool, cutoff: float) -> list[str]:
    """Prepared jobs last touched at or before `cutoff` — the rule recovery replays by."""
    return [job.id for job in spool.jobs(JobState.PREPARED) if job.updated_at <= cutoff]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _maintenance_reasons(uri: str, now: float, cadence: float, max_failures: int
                         ) -> list[Reason]:
    from jobspool.projection.maintenance import read_maintenance_state

    state = read_maintenance_state(uri)
    tables = state.get("tables")
    if not isinstance(tables, dict):
        return []
    out: list[Reason] = []
    bound = STALE_FACTOR * cadence
    for name in sorted(tables):
        entry = tables[name]
        if not isinstance(entry, dict):
            continue
        failures = entry.get("consecutive_failures")
        reason = str(entry.get("last_reason") or "")
        if isinstance(failures, int) and not isinstance(failures, bool) and \
                failures >= max_failures:
            out.append(Reason(
                "maintenance_failing",
                f"projection table {name!r} at {uri}: optimize failed {failures} times in a row, "
                f"last: {reason[:200] or 'no reason recorded'}; run `jobspool maintain --tables "
                f"{name}` and read its error",
                failures))
            continue
        outcome = entry.get("last_outcome")
        fine = outcome == "optimized" or (outcome == "skipped" and reason.startswith(_FINE_SKIPS))
        if fine or outcome is None:
            continue
        # Maintenance was attempted and did not succeed: how long since it last did?
        since = _number(entry.get("last_success"))
        if since is None:
            since = _number(entry.get("first_attempt"))
        if since is None or now - since <= bound:
            continue
        out.append(Reason(
            "maintenance_stale",
            f"projection table {name!r} at {uri}: no successful maintenance for "
            f"{now - since:.0f} s (over 3x the {cadence:g} s cadence), last outcome {outcome}: "
            f"{reason[:200] or 'no reason recorded'}; run `jobspool maintain --tables {name}`",
            round(now - since, 3)))
    return out


__all__ = ["Health", "Reason", "check_health", "default_projection"]
