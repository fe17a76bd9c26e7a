"""What a journal reads: a spool's jobs (one file, every copy of one job, and what to
say when a file is there but cannot be read) and the settings it was opened with.

Both are bases of `Journal` (journal.py), which adds the one write path; nothing here
takes the lock or writes, so a reader opened `read_only` uses all of it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

from jobspool.errors import JobNotFound, JobspoolError, SpoolError, UnreadableJob
from jobspool.queue.diskerrors import SHORT_OF_RESOURCES, listing_failed, read_failed
from jobspool.queue.job import CorruptJob, Job, decode_job, survivor_key
from jobspool.queue.layout import SpoolSettings, effective_keep_dead
from jobspool.queue.options import ProcessOptions
from jobspool.queue.states import ALL_STATES, JobState
from jobspool.queue.store import JOB_SUFFIX, Store
from jobspool.queue.unreadable import report_unreadable


class JournalReads:
    """The reads of one spool directory (`Journal` sets `root` and `store`)."""

    root: Path
    store: Store

    def read_job(self, state: JobState, job_id: str) -> Job | None:
        """One job file, or None when absent; a corrupt file is logged and treated as absent."""
        return self.examine(state, job_id)[0]

    def examine(self, state: JobState, job_id: str) -> tuple[Job | None, bool]:
        """One job file and whether it is there but cannot be read as that job (logged). A
        file gone since a listing is not unreadable: a concurrent move took it."""
        try:
            data = self.store.read(state.value, job_id + JOB_SUFFIX)
        except FileNotFoundError:
            return None, False
        except OSError as exc:  # a directory in its place, no permission: unreadable
            if exc.errno in SHORT_OF_RESOURCES or exc.errno == errno.EIO:
                # Out of descriptors, or an I/O error: nothing said of the file (taken for
                # unreadable, a settle was refused as a lost lease, its result thrown away).
                raise read_failed(exc, self.root) from None
            report_unreadable(state.value, job_id, exc.strerror or str(exc))
            return None, True
        try:
            return decode_job(data, expect_id=job_id, expect_state=state), False
        except CorruptJob as exc:
            again = self._read_again(state, job_id, data)
            if again is not None:
                return again
            report_unreadable(state.value, job_id, exc.reason)
            return None, True

    def _read_again(self, state: JobState, job_id: str, first: bytes
                    ) -> tuple[Job | None, bool] | None:
        """A file that did not decode, read again: a file retired while it was read (its
        inode goes back to the pool and is rewritten with another job) gave another job's
        id or half a document, and readers warned of a corrupt file (and to run recover)
        for a healthy job that had just moved. What the path holds now, if it changed;
        None when it reads the same (corrupt for real)."""
        for _ in range(2):
            try:
                data = self.store.read(state.value, job_id + JOB_SUFFIX)
            except FileNotFoundError:
                return None, False  # it moved on
            except OSError:
                return None
            if data == first:
                return None
            try:
                return decode_job(data, expect_id=job_id, expect_state=state), False
            except CorruptJob:
                first = data
        return None

    def unreadable_file(self, job_id: str) -> str | None:
        """`<state>/<id>.json` when a file of this id exists though `locate` found no
        readable copy (no permission, garbage): the id is not free, nor the job missing."""
        for state in ALL_STATES:
            if self.store.present(state.value, job_id + JOB_SUFFIX):
                denied = self.store.denied(state.value, job_id + JOB_SUFFIX)
                if denied is not None:
                    # A directory this user may not search: no file is known to be there
                    # (it was "taken by an unreadable file", one that did not exist).
                    raise listing_failed(denied, self.root)
                return f"{state.value}/{job_id}{JOB_SUFFIX}"
        return None

    def readable_now(self, job_id: str) -> bool:
        """Whether some file of this id decodes as that job now (quietly: no warning)."""
        for state in ALL_STATES:
            try:
                data = self.store.read(state.value, job_id + JOB_SUFFIX)
                decode_job(data, expect_id=job_id, expect_state=state)
                return True
            except (OSError, CorruptJob):
                continue
        return False

    def not_found(self, job_id: str) -> JobspoolError:
        """`JobNotFound`, or the `SpoolError` of a state directory that is gone."""
        return self._gone_or(JobNotFound(job_id))

    def _gone_or(self, error: JobspoolError) -> JobspoolError:
        """`error`, unless a state directory is gone (moved, deleted under an open spool):
        the job may be in it, and "no such job (pruned, or never enqueued)" was a wrong,
        reassuring answer where every listing said the directory is missing."""
        for state in ALL_STATES:
            if not os.path.isdir(self.root / state.value):
                try:
                    self.store.names(state.value)
                except SpoolError as exc:
                    return exc
        return error

    def missing(self, job_id: str) -> JobspoolError:
        """What to raise for a job `locate` did not find: `JobNotFound`, or a `SpoolError`
        naming its unreadable file (it said "not found", exit 1, for a file it could not
        read)."""
        where = self.unreadable_file(job_id)
        if where is None:
            return self.not_found(job_id)
        path = self.root / where
        if not os.access(path, os.R_OK):
            # A valid job this user may not read (a group-read spool's private file):
            # `recover` would find nothing to quarantine there.
            return UnreadableJob(f"job {job_id!r}: its file {where} cannot be read by this "
                                 "user (permission denied); read it as the spool's owner",
                                 path=str(path))
        why = self._why(where, job_id)
        return UnreadableJob(f"job {job_id!r}: its file {where} cannot be read"
                             + (f" ({why})" if why else "") + "; run `jobspool recover` (it "
                             "moves the file to quarantine/)", path=str(path))

    def _why(self, where: str, job_id: str) -> str | None:
        """Why the file at `where` (`<state>/<id>.json`) does not decode as that job, read
        again quietly: the error says it, as the warning of a skipped file does."""
        state = JobState(where.partition("/")[0])
        try:
            decode_job(self.store.read(state.value, job_id + JOB_SUFFIX), expect_id=job_id,
                       expect_state=state)
        except CorruptJob as exc:
            return exc.reason
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    def locate(self, job_id: str) -> tuple[Job | None, list[JobState]]:
        """The newest copy of a job and the states holding stale copies (crash leftovers)."""
        copies = [j for j in (self.read_job(s, job_id) for s in ALL_STATES) if j is not None]
        if not copies:
            return None, []
        best = max(copies, key=survivor_key)
        return best, [j.state for j in copies if j is not best]

    def without_stale(self, names: dict[JobState, list[str]]) -> dict[JobState, list[str]]:
        """Listings of the state directories with stale copies left out (a power loss
        between a rename and the removal of the old file leaves one until `recover`):
        each id shown once, in the state of the copy recovery would keep. Free unless an
        id is in two listings; then its copies are read."""
        seen: dict[str, int] = {}
        for listed in names.values():
            for job_id in listed:
                seen[job_id] = seen.get(job_id, 0) + 1
        twice = {job_id for job_id, n in seen.items() if n > 1}
        if not twice:
            return names
        keep_in = {}
        for job_id in twice:
            best, _ = self.locate(job_id)
            keep_in[job_id] = None if best is None else best.state
        return {s: [j for j in listed if j not in keep_in or keep_in[j] is s]
                for s, listed in names.items()}

    def leased_jobs(self) -> Iterator[Job]:
        """The readable jobs in `leased/` now (one listing, one read each; an unreadable
        file is recovery's to look at)."""
        for job_id in self.store.names(JobState.LEASED.value):
            job = self.read_job(JobState.LEASED, job_id)
            if job is not None:
                yield job


class JournalSettings:
    """A journal's settings as properties (`Journal` sets `settings` and `options`)."""

    settings: SpoolSettings
    options: ProcessOptions

    # The settings, read where they are used (frozen: one value per opened spool).
    @property
    def lease_seconds(self) -> float:
        return self.settings.lease_seconds

    @property
    def max_attempts(self) -> int:
        return self.settings.max_attempts

    @property
    def keep_terminal(self) -> int:
        return self.settings.keep_terminal

    @property
    def keep_terminal_seconds(self) -> float | None:
        return self.settings.keep_terminal_seconds

    @property
    def keep_dead(self) -> int:
        return effective_keep_dead(self.settings)

    @property
    def max_rescues(self) -> int | None:
        return self.settings.max_rescues

    @property
    def prepare_grace_seconds(self) -> float:
        return self.settings.prepare_grace_seconds

    @property
    def max_job_bytes(self) -> int:
        return self.settings.max_job_bytes

    @property
    def max_due(self) -> int | None:
        return self.options.max_due

    @property
    def max_lag_seconds(self) -> float | None:
        return self.options.max_lag_seconds
