"""`fsck`: a read-only check of every on-disk invariant of a spool (DESIGN §2, §4).

Checked: each file of a state directory is a readable job (`<id>.json`, the
id field matching the name, the state field matching the directory, every
field well typed, and in range: no negative attempts, no lease outside
`leased/`); one file per job id; the fence counter readable and at
least every lease token on disk; no stale staging file in `tmp/`.

Like recovery it scans without the lock and re-checks whatever looked wrong
under the lock (briefly, in batches), so a live worker moving a job during
the scan is not reported as a fault. The lock is taken only to read: fsck
never writes, moves or removes anything. Informational notes (expired
leases, prepared jobs past their grace period, quarantined files, terminal
directories over their retention limit) do not make the spool unhealthy:
they are what `recover` is for, and are reported apart from the problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobspool.errors import shown_name
from jobspool.queue.fence import FENCE_FILE, decode_fence
from jobspool.queue.layout import ADMIN_BATCH as BATCH
from jobspool.queue.states import ALL_STATES, TERMINAL, JobState
from jobspool.queue.store import JOB_SUFFIX, TMP_DIR
from jobspool.recovery.quarantine import confirm, quarantined_files
from jobspool.recovery.scan import Scan, probe, scan_spool
from jobspool.recovery.strays import stray_tmp_files

if TYPE_CHECKING:
    from jobspool.queue.job import Job
    from jobspool.queue.journal import Journal



@dataclass(frozen=True, slots=True)
class FsckReport:
    """The outcome of `fsck`: `ok` when `problems` is empty; each problem names its file."""

    ok: bool
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)  # readable job files per state
    jobs: int = 0
    fence: int | None = None
    max_token: int = 0
    quarantined: int = 0
    temp_files: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": list(self.problems), "notes": list(self.notes),
                "counts": dict(self.counts), "jobs": self.jobs, "fence": self.fence,
                "max_token": self.max_token, "quarantined": self.quarantined,
                "temp_files": self.temp_files}


def fsck(spool: Journal) -> FsckReport:
    """Check the spool without changing it; see the module docstring."""
    scan = scan_spool(spool)
    problems: list[str] = []

    # Files that are not readable jobs, and ids with several copies: confirmed under the lock.
    strays = [b for b in scan.bad if not b.name.endswith(JOB_SUFFIX)]
    suspects = sorted(set(scan.duplicates()) |
                      {b.name[: -len(JOB_SUFFIX)] for b in scan.bad if b.name.endswith(JOB_SUFFIX)})
    reread: list[Job] = []  # read under the lock where the scan could not (a passing error)
    listed = {e.job_id for e in scan.entries}
    for start in range(0, len(suspects), BATCH):
        with spool.lock.hold():
            for job_id in suspects[start:start + BATCH]:
                found, issues = _check_id(spool, job_id)
                problems.extend(issues)
                if job_id not in listed:
                    reread.extend(found)
    for start in range(0, len(strays), BATCH):
        with spool.lock.hold():
            for stray in strays[start:start + BATCH]:
                bad = confirm(spool, stray)
                if bad is not None:
                    problems.append(f"{shown_name(bad.path)}: {bad.reason}")

    top, _ = scan.max_token()
    with spool.lock.hold():
        fence, fence_problem = _read_fence(spool)  # the ceiling on disk (fence.py)
        # The last token handed out, as `stats` says it (a reader too: `fence_value` reads
        # this boot's shared counter); it said the ceiling on disk to a read-only reader,
        # which `jobspool fsck` always is, so the two commands disagreed on "fence".
        issued = fence if fence is None else spool.fence_value()
        temps = _temp_files(spool)
        if fence is not None and fence < top:
            # Tokens only grow and the counter only grows: re-read the holder to be sure.
            holders = [e for e in scan.entries if e.token is not None and e.token > fence]
            for e in holders:
                good, _ = probe(spool, e.job_id)
                for job in good:
                    if job.lease is not None and job.lease.token > fence:
                        problems.append(f"{FENCE_FILE}: counter {fence} is below token "
                                        f"{job.lease.token} in {job.state.value}/{job.id}{JOB_SUFFIX}")
    if fence_problem:
        problems.append(fence_problem)
    problems.extend(f"{TMP_DIR}/{shown_name(name)}: stray temp file (no live writer will publish it)"
                    for name in temps)

    counts = {s.value: 0 for s in ALL_STATES}
    for e in scan.entries:
        counts[e.state.value] += 1
    for job in reread:
        counts[job.state.value] += 1
    quarantined = len(quarantined_files(spool))
    return FsckReport(ok=not problems, problems=tuple(problems),
                      notes=tuple(_notes(spool, scan, counts, quarantined)), counts=counts,
                      jobs=len(listed | {j.id for j in reread}), fence=issued, max_token=top,
                      quarantined=quarantined, temp_files=len(temps))


def _check_id(spool: Journal, job_id: str) -> tuple[list[Job], list[str]]:
    """The readable copies of a suspect id, and its problems."""
    good, bad = probe(spool, job_id)
    out = [f"{shown_name(b.path)}: {b.reason}" for b in bad]
    if len(good) > 1:
        where = ", ".join(f"{j.state.value}/{shown_name(job_id)}{JOB_SUFFIX} "
                          f"(revision {j.revision})"
                          for j in good)
        out.append(f"job {shown_name(job_id)} has {len(good)} files: {where}")
    return good, out


def _read_fence(spool: Journal) -> tuple[int | None, str | None]:
    try:
        return decode_fence(spool.store.read("", FENCE_FILE)), None
    except FileNotFoundError:
        return None, f"{FENCE_FILE}: missing"
    except ValueError as exc:
        return None, f"{FENCE_FILE}: {exc}"


def _temp_files(spool: Journal) -> list[str]:
    # Called under the lock: see `stray_tmp_files` for what a live writer may leave there.
    return stray_tmp_files(spool.root / TMP_DIR)


def _notes(spool: Journal, scan: Scan, counts: dict[str, int], quarantined: int) -> list[str]:
    now = spool.now()
    notes: list[str] = []
    expired = [e for e in scan.in_state(JobState.LEASED)
               if e.expires_at is not None and e.expires_at <= now]
    if expired:
        notes.append(f"{len(expired)} expired lease(s), e.g. leased/{expired[0].job_id}{JOB_SUFFIX}"
                     " (recover or a claim returns them)")
    cutoff = now - spool.prepare_grace_seconds
    stuck = [e for e in scan.in_state(JobState.PREPARED) if e.updated_at <= cutoff]
    if stuck:
        notes.append(f"{len(stuck)} prepared job(s) past the grace period, e.g. "
                     f"prepared/{stuck[0].job_id}{JOB_SUFFIX} (recover --app replays them)")
    if quarantined:
        notes.append(f"{quarantined} file(s) in quarantine/")
    from jobspool.recovery.prune import _victims

    for s in sorted(TERMINAL, key=lambda s: s.value):
        # The rule a prune applies (`prune._victims`): dead letters by `keep_dead`, and
        # with `keep_terminal_seconds` only jobs older than it. The note said "over
        # keep_terminal (prune removes the oldest)" of dead letters a prune keeps.
        name, limit = (("keep_dead", spool.keep_dead) if s is JobState.DEAD_LETTER
                       else ("keep_terminal", spool.keep_terminal))
        older = spool.keep_terminal_seconds
        going = _victims(scan.in_state(s), limit, older, now)
        if going:
            age = f" and older than keep_terminal_seconds={older:g}" if older is not None else ""
            notes.append(f"{s.value}/ holds {counts[s.value]} jobs: {len(going)} of them beyond "
                         f"{name}={limit}{age}, which a prune removes (the oldest first)")
    return notes

