"""Boot recovery (DESIGN §6): repair what a crash left, reclaim, replay, prune.

`recover(spool, replay)` runs on boot in every process (`jobspool recover`,
a systemd `ExecStartPre=`), possibly while other processes work on the same
spool, so it never holds the spool lock for long: one lock-free scan of the
state directories (see `scan.py`) finds suspects, and each step re-checks its
suspects under the lock, in batches of at most `BATCH` jobs, before acting.
Every job move goes through `Spool.commit_changes` (the store's write sequence,
durable flushes included) with snapshots computed by the state machine.

The steps, in order (each idempotent: a second run finds nothing to do):

1. duplicates — one id in several state directories (a crash between the
   rename that publishes a new version and the removal of the old one): the
   copy with the higher revision stays (ties: see `scan.survivor_key`), the
   others are removed;
2. quarantine — files in state directories that are not readable jobs go
   to `quarantine/` with a reason file (`quarantine.py`), never deleted;
3. temp files — everything in `tmp/` that no live writer will publish is
   removed (`strays.stray_tmp_files`): staging files are created and consumed
   within one lock hold, so under the lock any `.tmp` belongs to a writer
   that died; a producer's `.stage` file goes once its writer's liveness
   lock is free; anything else is a stray. `tmp/pool/` (recycled files) is
   only trimmed to the store's pool size;
4. fence — raised to the largest lease token found on disk (a crash in the
   middle of a claim batch can publish a token before the counter), and
   rebuilt from the tokens when the file is unreadable;
5. expired leases, and leases whose holder is provably dead (its liveness
   lock is free, `liveness.py`) at once — back to `retryable`, or
   `dead_letter` when attempts or rescues are exhausted (`machine.reclaim`);
   a dead holder's jobs whose handlers never started go back to `ready`
   uncounted. The dead processes' liveness files are removed afterwards;
6. prepared jobs past `prepare_grace_seconds` — replayed (`replay.py`);
7. retention pruning (`prune.py`).

What it does not do: guess. A job whose only copy is unreadable stays in
quarantine for a human; a prepared job without a hook stays prepared.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from jobspool.errors import FULL_DISK, WriteFailed, shown_name
from jobspool.queue import liveness, machine
from jobspool.queue import store as store_mod
from jobspool.queue.fence import FENCE_FILE, decode_fence, encode_fence, restart_floor
from jobspool.queue.job import survivor_key
from jobspool.queue.layout import ADMIN_BATCH as BATCH
from jobspool.queue.layout import QUARANTINE_DIR
from jobspool.queue.states import CLAIMABLE, JobState
from jobspool.queue.store import JOB_SUFFIX, TMP_DIR, Change
from jobspool.recovery.prune import prune
from jobspool.recovery.quarantine import orphan_reasons, quarantine, quarantine_root_file
from jobspool.recovery.replay import ReplayHook, ReplayHooks, Verdict, ask, hook_for
from jobspool.recovery.scan import Bad, Scan, probe, scan_spool
from jobspool.recovery.strays import stray_tmp_files

if TYPE_CHECKING:
    from jobspool.queue.job import Job
    from jobspool.queue.journal import Journal

__all__ = ["BATCH", "RecoveryReport", "ReplayHook", "ReplayHooks", "recover"]

log = logging.getLogger(__name__)

HOOK_BATCH = 64  # replay verdicts gathered (outside the lock) per lock hold
# `.spool.json.<pid>.tmp` is written outside the lock when a spool is created: only an old
# one is surely abandoned.
ROOT_TMP_AGE = 60.0


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What one recovery pass did, step by step; each field holds the ids (or paths) involved."""

    duplicates_resolved: tuple[str, ...] = ()  # job ids whose extra copies were removed
    stale_copies_removed: tuple[str, ...] = ()  # `state/id.json` of the removed copies
    quarantined: tuple[str, ...] = ()  # source paths (`state/name`) moved to quarantine/
    quarantine_names: tuple[str, ...] = ()  # their names inside quarantine/
    # `tmp/<name>`, root-level leftovers, and reason files left alone in quarantine/
    temp_files_removed: tuple[str, ...] = ()
    pool_files_trimmed: tuple[str, ...] = ()  # `tmp/pool/<name>` beyond the pool size
    fence_raised: tuple[str, ...] = ()  # ids holding tokens above the old fence (or "fence")
    leases_reclaimed: tuple[str, ...] = ()  # expired (or dead holders') leases to retryable
    leases_returned: tuple[str, ...] = ()  # dead holders' unstarted jobs back to ready
    dead_lettered: tuple[str, ...] = ()  # moved to dead_letter (reclaim or replay exhausted)
    replayed_committed: tuple[str, ...] = ()
    replayed_aborted: tuple[str, ...] = ()
    replay_unknown: tuple[str, ...] = ()  # stayed prepared, attempt counted
    prepared_pending: tuple[str, ...] = ()  # past the grace period but no hook for the kind
    pruned: tuple[str, ...] = ()
    # The fence as recovery found and left what it repairs: on the file spool the ceiling in
    # the fence file (tokens are handed out in blocks below it; `stats().fence` is the last
    # one handed out), on PostgreSQL the token sequence. None: the file was missing or
    # unreadable.
    fence_before: int | None = None
    fence_after: int | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {f.name: len(getattr(self, f.name)) for f in fields(self)
                if f.name not in ("fence_before", "fence_after")}

    @property
    def changed(self) -> bool:
        """Whether this pass changed anything on disk (a pending report is not a change)."""
        return any(n for name, n in self.counts.items() if name != "prepared_pending")

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON: each step's ids (its count is their number), the fence, `changed`."""
        doc: dict[str, Any] = {"changed": self.changed}
        doc.update({name: list(getattr(self, name)) for name in self.counts})
        doc["fence_before"] = self.fence_before
        doc["fence_after"] = self.fence_after
        return doc


def recover(spool: Journal, replay: ReplayHooks | None = None) -> RecoveryReport:
    """Run every recovery step once (see the module docstring); safe beside live workers."""
    scan = scan_spool(spool)
    dups, stale, moved = _repair(spool, scan)
    temps, trimmed = _clean_tmp(spool)
    try:
        fence_ids, before, after = _raise_fence(spool, scan, moved)
        if spool.fence_rebuilt and "fence" not in fence_ids:
            # Opening the spool to recover it rebuilt a deleted fence file (`Journal`):
            # the same repair as a garbage one's, reported alike.
            fence_ids, before = ["fence", *fence_ids], None
            spool.fence_rebuilt = False
        reclaimed, returned, dead = _reclaim(spool, scan)
        committed, aborted, unknown, dead_replay, pending = _replay(spool, scan, replay)
    except WriteFailed as exc:
        # On a full disk the steps that write failed before the one that frees space:
        # retention's pruning (removals only). Pruned, the whole recovery goes again.
        if exc.errno not in FULL_DISK or not prune(spool, scan=scan).pruned:
            raise
        log.warning("recovery of %s: the disk was full; pruned old finished jobs by the "
                    "spool's retention and went again", spool.root)
        return recover(spool, replay)
    # Jobs the steps above finished (dead-lettered, aborted by replay) are not in the scan:
    # pruned from it, recovery left its own over the limit, for the next run (DESIGN §6
    # prunes after replaying, as the PostgreSQL store does).
    finished = bool(dead or dead_replay or aborted)
    pruned = prune(spool, scan=None if finished else scan).pruned
    report = RecoveryReport(
        duplicates_resolved=tuple(dups), stale_copies_removed=tuple(stale),
        quarantined=tuple(src for src, _ in moved), quarantine_names=tuple(q for _, q in moved),
        temp_files_removed=tuple(temps), pool_files_trimmed=tuple(trimmed),
        fence_raised=tuple(fence_ids), leases_reclaimed=tuple(reclaimed),
        leases_returned=tuple(returned),
        dead_lettered=tuple(dead + dead_replay), replayed_committed=tuple(committed),
        replayed_aborted=tuple(aborted), replay_unknown=tuple(unknown),
        prepared_pending=tuple(pending), pruned=pruned, fence_before=before, fence_after=after)
    if report.changed:
        log.info("recovery of %s: %s", spool.root,
                 {k: v for k, v in report.counts.items() if v})
    return report


# ---------------------------------------------------------------- 1, 2: duplicates, quarantine


def _repair(spool: Journal, scan: Scan) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    suspects = set(scan.duplicates())
    strays: list[Bad] = []
    for bad in scan.bad:
        if bad.name.endswith(JOB_SUFFIX):
            suspects.add(bad.name[: -len(JOB_SUFFIX)])
        else:
            strays.append(bad)
    dups: list[str] = []
    stale: list[str] = []
    moved: list[tuple[str, str]] = []
    ordered = sorted(suspects)
    for start in range(0, len(ordered), BATCH):
        with spool.lock.hold():
            to_quarantine: list[Bad] = []
            removals: list[Change] = []
            for job_id in ordered[start:start + BATCH]:
                good, unreadable = probe(spool, job_id)
                to_quarantine.extend(unreadable)
                if len(good) < 2:
                    continue
                best = max(good, key=survivor_key)
                for copy in good:
                    if copy is not best:
                        removals.append(Change(name=job_id + JOB_SUFFIX, dst=None, data=None,
                                               src=copy.state.value))
                        stale.append(f"{copy.state.value}/{job_id}{JOB_SUFFIX}")
                dups.append(job_id)
            moved.extend(quarantine(spool, to_quarantine))
            spool.commit_changes([], removals)
    for start in range(0, len(strays), BATCH):
        with spool.lock.hold():
            moved.extend(quarantine(spool, strays[start:start + BATCH]))
    return dups, stale, moved


# ---------------------------------------------------------------- 3: temp files


def _clean_tmp(spool: Journal) -> tuple[list[str], list[str]]:
    removed: list[str] = []
    trimmed: list[str] = []
    tmp = spool.root / TMP_DIR
    with spool.lock.hold():
        # Under the lock no writer is between staging and publishing: what is left is a
        # dead writer's, a person's or an older version's (see `stray_tmp_files`).
        for name in stray_tmp_files(tmp):
            if _remove_stray(tmp / name):
                removed.append(f"{TMP_DIR}/{name}")
        for name in liveness.stale_new_files(spool.root):
            if _unlink(spool.root / liveness.LIVE_DIR / name):
                removed.append(f"{liveness.LIVE_DIR}/{name}")
        root_dirty = False
        for name in os.listdir(spool.root):
            if not (name.startswith(".") and name.endswith(".tmp")):
                continue
            path = spool.root / name
            # `.fence.*.tmp` is only written under the lock; the spool.json one is not.
            if not name.startswith(f".{FENCE_FILE}.") and not _older_than(path, ROOT_TMP_AGE):
                continue
            if _unlink(path):
                removed.append(name)
                root_dirty = True
        orphans = orphan_reasons(spool.root / QUARANTINE_DIR)
        for name in orphans:
            if _unlink(spool.root / QUARANTINE_DIR / name):
                removed.append(f"{QUARANTINE_DIR}/{name}")
        pool = sorted(spool.store.pool_names())
        for name in pool[spool.store.pool_size:]:
            if _unlink(spool.root / store_mod.POOL_DIR / name):
                trimmed.append(f"{store_mod.POOL_DIR}/{name}")
        if trimmed:
            spool.store.forget_pool()
        if spool.durable:
            if removed:
                store_mod.fsync_dir(tmp)
            if root_dirty:
                store_mod.fsync_dir(spool.root)
            if orphans:
                store_mod.fsync_dir(spool.root / QUARANTINE_DIR)
            if trimmed:
                store_mod.fsync_dir(spool.root / store_mod.POOL_DIR)
    return removed, trimmed


def _remove_stray(path: os.PathLike[str]) -> bool:
    """Remove a stray entry of tmp/. A directory that resists (holding what this user may
    not delete) is left with a warning, not a failed recover on every boot; a file that
    cannot be unlinked is the disk's failure, and is reported (raised)."""
    try:
        return store_mod.remove_entry(path)
    except OSError as exc:
        try:
            is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
        except OSError:
            is_dir = False
        if not is_dir:
            raise
        log.warning("could not remove %s (%s); left in place", shown_name(str(path)),
                    exc.strerror or exc)
        return False


def _unlink(path: os.PathLike[str]) -> bool:
    try:
        store_mod.os_unlink(path)
    except FileNotFoundError:
        return False
    return True


def _older_than(path: os.PathLike[str], seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > seconds
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------- 4: fence


def _raise_fence(spool: Journal, scan: Scan, moved: list[tuple[str, str]]
                 ) -> tuple[list[str], int | None, int | None]:
    """Make the fence at least every token the scan saw; a damaged fence file moved to
    quarantine is added to `moved` (reported with the job files quarantined: the next
    `health` counted a quarantined file this report had not named).

    The scan is enough: a token written after it was minted from the counter
    as it then stood (a claim refuses to run on an unreadable counter), so
    only tokens already on disk can be above it.
    """
    top, _ = scan.max_token()
    with spool.lock.hold():
        current: int | None
        try:
            current = decode_fence(spool.store.read("", FENCE_FILE))
        except FileNotFoundError:
            current = None
        except ValueError as exc:
            current = None
            _note(moved, quarantine_root_file(spool, FENCE_FILE,
                                              f"unreadable fence counter: {exc}"))
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            current = None  # never followed: what it points at is not the spool's
            _note(moved, quarantine_root_file(spool, FENCE_FILE,
                                              "a symlink where the fence file belongs"))
        floor = current or 0
        if current is not None:
            # (Below the ceiling but above every token handed out, a file put back by hand,
            # raises only the shared counter: the next claims would mint tokens below it.)
            if not spool.fence_above(top, current):
                return [], current, current
            value = top
        else:
            # Pruned jobs took their tokens with them: the scan alone may be far below what
            # was handed out. The lock's shared counter knows (unless `.lock` went too);
            # any value it holds was a real token or ceiling, so raising to it is safe.
            # And the tokens of terminal jobs are gone from disk: above them all, the clock.
            value = max(top, spool.lock.generation(spool.lock.FENCE_NEXT_SLOT),
                        spool.lock.generation(spool.lock.FENCE_CEILING_SLOT), restart_floor())
            spool.commit_changes([], [Change(name=FENCE_FILE, dst="",
                                             data=encode_fence(value))])
            spool.fence.raised(value)
            # Claims failed on the broken counter, possibly after dropping candidates from
            # their processes' caches: make every process relist the claimable directories.
            spool.touch(CLAIMABLE)
    ids = sorted({e.job_id for e in scan.entries if e.token is not None and e.token > floor})
    log.warning("fence of %s raised from %s to %d (tokens on disk above it: %s)", spool.root,
                current, value, ids or "none")
    return ids or [FENCE_FILE], current, value


def _note(moved: list[tuple[str, str]], qname: str | None) -> None:
    if qname is not None:
        moved.append((FENCE_FILE, qname))


# ---------------------------------------------------------------- 5: expired leases


def _reclaim(spool: Journal, scan: Scan) -> tuple[list[str], list[str], list[str]]:
    leased = sorted(e.job_id for e in scan.in_state(JobState.LEASED))
    reclaimed: list[str] = []
    returned: list[str] = []
    dead: list[str] = []
    verdicts: dict[str, tuple[str, dict[str, object] | None]] = {}

    def holder(proc: str | None) -> tuple[str, dict[str, object] | None]:
        if proc is None:
            return liveness.Verdict.UNKNOWN, None
        if proc not in verdicts:
            verdicts[proc] = liveness.probe(spool.root, proc)
        return verdicts[proc]

    for start in range(0, len(leased), BATCH):
        with spool.lock.hold():
            now = spool.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            extra: list[Change] = []
            for job_id in leased[start:start + BATCH]:
                job, stale = spool.locate(job_id)
                if job is None or job.state is not JobState.LEASED or job.lease is None:
                    continue  # completed, heartbeated or reclaimed by a claim meanwhile
                verdict, doc = holder(job.lease.proc)
                gone = verdict == liveness.Verdict.DEAD
                if not gone and not machine.lease_expired(job, now):
                    continue
                new = machine.take_back(
                    job, now=now, running=liveness.running_tokens(doc) if gone else None,
                    policy=spool.policy, max_rescues=spool.max_rescues, rng=spool.rng)
                if new.state is JobState.READY:  # never started: back uncounted
                    returned.append(job_id)
                elif new.state is JobState.DEAD_LETTER:
                    warn_dead(new, "on reclaim by recovery")
                    dead.append(job_id)
                else:
                    reclaimed.append(job_id)
                pairs.append((job, new))
                extra.extend(spool.stale_removals(job_id, stale))
            spool.commit_changes(pairs, extra)
    # The dead processes' liveness files have told all they know, unless a lease still names
    # one: a process that claimed after the scan and died during this recovery left leases
    # this pass never saw, and removing its file hid them (from the next `recover` and from
    # claims, which then waited out a full lease). Under the lock: no lease appears meanwhile.
    with spool.lock.hold():
        held = _holders(spool)
        for ident in liveness.dead_marks(spool.root):
            if ident not in held:
                liveness.remove_dead(spool.root, ident)
    return reclaimed, returned, dead


def _holders(spool: Journal) -> set[str]:
    """The processes named by the leases in `leased/` now (one read per leased job)."""
    return {j.lease.proc for j in spool.leased_jobs()
            if j.lease is not None and j.lease.proc is not None}


# ---------------------------------------------------------------- 6: replay


def _replay(spool: Journal, scan: Scan, replay: ReplayHooks | None
            ) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
    cutoff = spool.now() - spool.prepare_grace_seconds
    due = sorted((e for e in scan.in_state(JobState.PREPARED) if e.updated_at <= cutoff),
                 key=lambda e: e.job_id)
    out: dict[str, list[str]] = {k: [] for k in ("committed", "aborted", "unknown", "dead")}
    pending: list[str] = []
    for start in range(0, len(due), HOOK_BATCH):
        verdicts: list[Verdict] = []
        for entry in due[start:start + HOOK_BATCH]:
            hook = hook_for(replay, entry.kind)
            if hook is None:
                pending.append(entry.job_id)
                continue
            job = spool.read_job(JobState.PREPARED, entry.job_id)
            if job is None or job.revision != entry.revision or \
                    job.updated_at != entry.updated_at:
                # Committed or aborted by its producer since the scan (or aborted, pruned
                # and prepared again: the same revision, another reservation).
                continue
            # Outside the lock: a hook may take seconds (it asks the primary store).
            verdicts.append(ask(hook, job))
        if not verdicts:
            continue
        with spool.lock.hold():
            now = spool.now()
            pairs: list[tuple[Job | None, Job | None]] = []
            extra: list[Change] = []
            for v in verdicts:
                job, stale = spool.locate(v.job.id)
                if job is None or job.state is not JobState.PREPARED or \
                        job.revision != v.job.revision or job.updated_at != v.job.updated_at:
                    continue  # the producer spoke meanwhile: its word wins over the hook's
                new = machine.replay(job, v.outcome, now=now, error=v.error)
                pairs.append((job, new))
                extra.extend(spool.stale_removals(job.id, stale))
                if new.state is JobState.DEAD_LETTER:
                    warn_dead(new, "by replay")
                    out["dead"].append(job.id)
                else:
                    out[v.outcome].append(job.id)
            spool.commit_changes(pairs, extra)
    return out["committed"], out["aborted"], out["unknown"], out["dead"], pending


def warn_dead(job: Job, how: str) -> None:
    # A dead letter needs a human: never silent (the same record shape as the spool's own).
    log.warning("job %s (%s) dead-lettered %s: %s", job.id, job.kind, how, job.last_error,
                extra={"job_id": job.id, "kind": job.kind, "state": job.state.value})
