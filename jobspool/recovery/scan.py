"""One lock-free pass over every state directory: what recovery, fsck and pruning act on.

Why lock-free: a scan reads every job file, O(jobs), and holding the spool
lock that long would stop every worker. Writes are atomic renames, so a file
read here is always some complete version (or gone: moved meanwhile). What
the scan finds is therefore a list of *suspects*, never a verdict: every
step that acts on it re-reads the files concerned under the lock first.

One caveat makes that re-check necessary even for "corrupt" verdicts: the
store recycles superseded files as staging files (`tmp/pool/`), rewriting
their inode in place. A lock-free reader that opened a file just before it
was superseded may read another job's bytes, or half of them. Under the
lock no writer runs, so a second read there is authoritative.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobspool.queue.diskerrors import listing_failed
from jobspool.queue.job import CorruptJob, Job, decode_job
from jobspool.queue.states import ALL_STATES, JobState
from jobspool.queue.store import JOB_SUFFIX, ignored_name

if TYPE_CHECKING:
    from jobspool.queue.journal import Journal


@dataclass(frozen=True, slots=True)
class Entry:
    """What the scan keeps of one readable job file (not the payload: a scan must stay small)."""

    state: JobState
    job_id: str
    kind: str
    revision: int
    updated_at: float
    token: int | None
    expires_at: float | None

    @property
    def path(self) -> str:
        return f"{self.state.value}/{self.job_id}{JOB_SUFFIX}"


@dataclass(frozen=True, slots=True)
class Bad:
    """A file in a state directory that is not a readable job: `dir/name` and why."""

    directory: str
    name: str
    reason: str

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.name}" if self.directory else self.name


@dataclass
class Scan:
    """Everything one pass over the state directories saw."""

    entries: list[Entry] = field(default_factory=list)
    bad: list[Bad] = field(default_factory=list)
    # job id -> state directories holding a `<id>.json` (readable or not)
    where: dict[str, list[JobState]] = field(default_factory=dict)

    def duplicates(self) -> list[str]:
        """Ids with a file in more than one state directory."""
        return sorted(i for i, states in self.where.items() if len(states) > 1)

    def in_state(self, state: JobState) -> list[Entry]:
        return [e for e in self.entries if e.state is state]

    def max_token(self) -> tuple[int, str | None]:
        """The largest lease token in any readable job file, and the file holding it."""
        best, path = 0, None
        for e in self.entries:
            if e.token is not None and e.token > best:
                best, path = e.token, e.path
        return best, path


def read_job(spool: Journal, directory: str, name: str) -> Job | Bad | None:
    """Read and decode one file of a state directory; None when it is not there (any more)."""
    state = JobState(directory)
    if not name.endswith(JOB_SUFFIX):
        if not os.path.lexists(spool.root / directory / name):
            return None
        return Bad(directory, name, "not a job file (name does not end in .json)")
    try:
        data = spool.store.read(directory, name)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return Bad(directory, name, "a directory where a job file belongs")
    except OSError as exc:
        return Bad(directory, name, f"cannot read: {exc.strerror or exc}")
    try:
        return decode_job(data, expect_id=name[: -len(JOB_SUFFIX)], expect_state=state)
    except CorruptJob as exc:
        return Bad(directory, name, exc.reason if data else "empty file")


def entry_of(job: Job) -> Entry:
    return Entry(state=job.state, job_id=job.id, kind=job.kind, revision=job.revision,
                 updated_at=job.updated_at,
                 token=None if job.lease is None else job.lease.token,
                 expires_at=None if job.lease is None else job.lease.expires_at)


def _listing(spool: Journal, state: JobState) -> list[tuple[str, bool]]:
    """(name, is a regular file) of each entry of one state directory."""
    try:
        with os.scandir(spool.root / state.value) as it:
            return [(e.name, e.is_file(follow_symlinks=False)) for e in it
                    if not ignored_name(e.name)]
    except OSError as exc:
        raise listing_failed(exc, spool.root) from None


def _read_listed(spool: Journal, state: JobState, listing: list[tuple[str, bool]],
                 out: Scan) -> None:
    directory = state.value
    for name, regular in listing:
        if name.endswith(JOB_SUFFIX):
            out.where.setdefault(name[: -len(JOB_SUFFIX)], []).append(state)
        if not regular:
            # A symlink could point outside the spool, a directory would make readers fail
            # with EISDIR: neither is a job, whatever its name.
            kind = "a symlink" if os.path.islink(spool.root / directory / name) else "not a file"
            out.bad.append(Bad(directory, name, f"{kind} where a job file belongs"))
            continue
        got = read_job(spool, directory, name)
        if got is None:
            continue  # moved on since the listing
        if isinstance(got, Bad):
            out.bad.append(got)
        else:
            out.entries.append(entry_of(got))


def scan_state(spool: Journal, state: JobState, out: Scan) -> None:
    """Add one state directory's files to `out` (one listing, one read per file)."""
    _read_listed(spool, state, _listing(spool, state), out)


def scan_spool(spool: Journal, states: tuple[JobState, ...] = ALL_STATES) -> Scan:
    """One lock-free pass over `states` (all of them by default)."""
    out = Scan()
    for state in states:
        scan_state(spool, state, out)
    return out


# The order a bounded scan spends its reads in: where a damaged file stops a job for good
# (claims and recovery skip it) before the terminal directories, whose files only report.
_SAMPLE_ORDER = (JobState.LEASED, JobState.PREPARED, JobState.RETRYABLE, JobState.READY,
                 JobState.DEAD_LETTER, JobState.COMPLETED, JobState.CANCELED)


def sample_spool(spool: Journal, limit: int, rng: random.Random | None = None
                 ) -> tuple[Scan, int, int]:
    """A lock-free pass reading at most `limit` files: every state directory is listed,
    and its files are read in `_SAMPLE_ORDER` until the budget is spent (a directory the
    remaining budget cannot cover is read as a random sample of it). Returns the scan,
    the files read and the files listed. For checks that must answer in bounded time
    however deep the spool (`health`); `fsck` and `recover` read everything."""
    rng = rng or random.Random()
    out = Scan()
    listings = {state: _listing(spool, state) for state in _SAMPLE_ORDER}
    total = sum(len(v) for v in listings.values())
    left = limit
    for state in _SAMPLE_ORDER:
        listing = listings[state]
        if len(listing) > left:
            listing = rng.sample(listing, left)
        left -= len(listing)
        _read_listed(spool, state, listing, out)
    return out, min(limit, total), total


def probe(spool: Journal, job_id: str) -> tuple[list[Job], list[Bad]]:
    """Every copy of one job, readable and not, read now (call under the lock to be exact)."""
    good: list[Job] = []
    bad: list[Bad] = []
    name = job_id + JOB_SUFFIX
    for state in ALL_STATES:
        path = spool.root / state.value / name
        if os.path.islink(path):
            bad.append(Bad(state.value, name, "a symlink where a job file belongs"))
            continue
        got = read_job(spool, state.value, name)
        if isinstance(got, Bad):
            bad.append(got)
        elif got is not None:
            good.append(got)
    return good, bad


