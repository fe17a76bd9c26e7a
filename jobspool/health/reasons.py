"""The shapes `health` reports in (`Reason`, `Health`) and the wording its messages share."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobspool.errors import shown_name

if TYPE_CHECKING:
    from jobspool.queue.api import SpoolAPI as Spool

STALE_FACTOR = 3.0
_EXAMPLES = 3  # job ids / tables named in a message


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


def ids(ids: list[str], total: int | None = None) -> str:
    """A few of `ids` (of `total`, when more exist than were listed)."""
    total = len(ids) if total is None else total
    shown = ", ".join(shown_name(i) for i in ids[:_EXAMPLES])
    return shown + (f" and {total - _EXAMPLES} more" if total > _EXAMPLES else "")


def plural(n: int, word: str) -> str:
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def default_projection(spool: Spool) -> str | None:
    """`<root>/index` when that directory exists (where a worker projects by default)."""
    from jobspool.queue.layout import default_projection_of

    path = default_projection_of(spool)
    return path if os.path.isdir(path) else None
