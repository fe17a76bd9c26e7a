"""The naive file queue: the reference design jobspool improves on (depth comparison only).

One JSON file per job in a directory per state. Every call takes the queue's
lock and then reads and parses every job file in every state directory, to
find the oldest ready jobs, to check lease tokens and to count. Writes are as
durable as jobspool's: each new file is fsynced before the rename that
publishes it and each touched directory is fsynced once per call. Its cost per
call grows with the number of jobs on disk, which is what the depth
comparison shows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from bench.peers.base import Adapter, Claimed, dumps, loads, payload

STATES = ("ready", "leased", "done")


def check_available() -> None:
    import portalocker  # noqa: F401


class NaiveFilesAdapter(Adapter):
    def __init__(self, root: str, *, keep_done: int = 1000, **options: Any) -> None:
        super().__init__(root, **options)
        import portalocker

        self._portalocker = portalocker
        for d in ("tmp", *STATES):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        self.lock_path = os.path.join(root, "lock")
        self.keep_done = keep_done
        self.seq = 0
        self.tag = f"{os.getpid()}"

    # -- the naive part -------------------------------------------------------
    def _scan(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Read and parse every job file in every state directory."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for state in STATES:
            d = os.path.join(self.root, state)
            jobs: dict[str, dict[str, Any]] = {}
            for name in os.listdir(d):
                try:
                    with open(os.path.join(d, name), "rb") as f:
                        jobs[name] = loads(f.read())
                except FileNotFoundError:  # pragma: no cover - we hold the lock
                    continue
            out[state] = jobs
        return out

    def _lock(self) -> Any:
        return self._portalocker.Lock(self.lock_path, mode="a", flags=self._portalocker.LOCK_EX)

    # -- durable writes -------------------------------------------------------
    def _write(self, state: str, name: str, job: dict[str, Any], durable: bool = True) -> None:
        tmp = os.path.join(self.root, "tmp", name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, dumps(job))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(self.root, state, name))

    def _fsync_dirs(self, *states: str) -> None:
        for state in states:
            fd = os.open(os.path.join(self.root, state), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _new_jobs(self, ids: Sequence[int]) -> list[tuple[str, dict[str, Any]]]:
        now = time.time()
        out = []
        for i in ids:
            self.seq += 1
            name = f"{time.time_ns():020d}-{self.tag}-{self.seq}.json"
            out.append(
                (name, {"state": "ready", "created": now, "token": None, "payload": payload(i, self.pad)})
            )
        return out

    # -- the API --------------------------------------------------------------
    def enqueue(self, ids: Sequence[int]) -> None:
        with self._lock():
            scan = self._scan()
            for name, job in self._new_jobs(ids):
                if name in scan["ready"]:  # pragma: no cover - unique names
                    raise RuntimeError(f"duplicate job {name}")
                self._write("ready", name, job)
            self._fsync_dirs("ready")

    def claim(self, n: int) -> list[Claimed]:
        with self._lock():
            scan = self._scan()
            oldest = sorted(scan["ready"].items(), key=lambda kv: (kv[1]["created"], kv[0]))[:n]
            out = []
            for name, job in oldest:
                self.seq += 1
                token = f"{self.tag}-{self.seq}"
                job = {**job, "state": "leased", "token": token}
                self._write("leased", name, job)
                os.unlink(os.path.join(self.root, "ready", name))
                out.append(Claimed(job["payload"]["i"], (name, token)))
            if out:
                self._fsync_dirs("leased", "ready")
            return out

    def complete(self, claimed: Sequence[Claimed]) -> list[int]:
        with self._lock():
            scan = self._scan()
            done = []
            for c in claimed:
                name, token = c.handle
                job = scan["leased"].get(name)
                if job is None or job["token"] != token:  # lease lost
                    continue
                self._write("done", name, {**job, "state": "done"})
                os.unlink(os.path.join(self.root, "leased", name))
                done.append(c.i)
            surplus = len(scan["done"]) + len(done) - self.keep_done
            if surplus > 0:
                for name in sorted(scan["done"])[:surplus]:
                    os.unlink(os.path.join(self.root, "done", name))
            self._fsync_dirs("done", "leased")
            return done

    def prefill(self, ids: Sequence[int]) -> None:
        # Setup only: write the backlog straight into ready/ without the scans.
        for name, job in self._new_jobs(ids):
            self._write("ready", name, job, durable=False)
        os.sync()
