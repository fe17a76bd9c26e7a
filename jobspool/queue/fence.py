"""The spool-wide fencing counter: `<root>/fence` (a flushed ceiling) and `FenceCounter`.

Claims take tokens from a counter in shared memory under the spool lock; the
file holds a ceiling reserved in blocks, flushed before any token under it is
handed out (see `FenceCounter`), so a token is never written into a job
without a durable ceiling above it, and tokens are strictly increasing across
processes, crashes and reboots.

What it does not protect against: someone editing the file. `fsck` checks
that the ceiling is at or above every token found on disk and `recover` raises
it if not; a deleted or unreadable file restarts the counter above
`restart_floor()`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

from jobspool.errors import JobspoolError, SpoolError

if TYPE_CHECKING:
    from jobspool.queue.lock import SpoolLock

log = logging.getLogger("jobspool.queue")

FENCE_FILE = "fence"
FENCE_FORMAT = 1


def encode_fence(value: int) -> bytes:
    return orjson.dumps({"v": FENCE_FORMAT, "fence": value})


def decode_fence(data: bytes) -> int:
    """Parse the fence file; raise ValueError when it is unreadable (never guess a value:
    a guess too low would hand out a token twice)."""
    if not data:
        # Said as what it is (a power loss on a file system without write ordering leaves
        # it so), by fsck, health and recover alike: "not JSON" read as someone's edit.
        raise ValueError("fence file is empty (a power loss before its data reached the "
                         "disk?); workers restart tokens above the clock, `jobspool "
                         "recover` rewrites it")
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ValueError("fence file is not JSON") from None
    if isinstance(d, dict):
        value = d.get("fence")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    raise ValueError("fence file has no non-negative integer 'fence'")


class FenceEmpty(SpoolError):
    """The fence file is there and empty: what a power loss leaves of a rename whose data
    was not on disk yet (a file system without ordering)."""


def restart_floor() -> int:
    """Where tokens restart when the fence file is lost and nothing else can say how far the
    counter went: the wall clock in microseconds.

    Terminal jobs keep no token and pruned ones are gone, so the tokens left on disk may be
    far below what was handed out; restarting from them handed tokens out again (a new
    claim's projection writes were then dropped as stale, its job reported completed). A
    counter grows by one per claim and a block per ceiling write: passing 1.7e15 would
    take a spool 18,000 years at 3,000 claims a second, so the clock is above every token
    any spool has handed out, and tokens stay below 2**53 (a projection's float64 version)
    for centuries more.
    """
    return int(time.time() * 1_000_000)


# Tokens per ceiling write: the counter on disk is rewritten (and flushed) once per
# BLOCK tokens handed out, not once per claim.
BLOCK = 1024


class FenceCounter:
    """The spool-wide fencing counter: tokens from shared memory, a flushed ceiling on disk.

    Tokens are handed out under the spool lock from a counter in the lock
    file's shared memory (`SpoolLock.FENCE_NEXT_SLOT`); the file `<root>/fence`
    holds a *ceiling*: no token above it has ever been handed out. When a claim
    needs tokens past the ceiling, a new ceiling (a block of `BLOCK` more) is
    written and flushed *before* those tokens exist anywhere, so every token on
    disk is at or below the ceiling on disk.

    Strictly increasing across processes (one counter in shared memory, under
    the lock), crashes (the map survives a process), reboots and a lost map
    (a new boot or a new `.lock` zeroes the cached ceiling: the next claim
    restarts from the ceiling on disk, above every token ever handed out).
    What it does not survive: someone lowering the file by hand (`recover`
    raises it to the largest token on disk). A jobspool from before this scheme
    writes its last token to the file at each claim: every claim here stats the
    file and takes in a change it did not make (`_moved_on_disk`).
    """

    def __init__(self, lock: SpoolLock, read_disk: Callable[[], int],
                 write_disk: Callable[[int], None], disk_ident: Callable[[], int],
                 leased_top: Callable[[], int] | None = None) -> None:
        self._lock = lock
        self._read_disk = read_disk
        self._write = write_disk
        self._disk_ident = disk_ident
        # The largest token in `leased/`, read at this process's first take: a backup of a
        # live spool restored over it (`.lock` and `fence` with it) holds a counter below
        # the leases it restored, and tokens 1, 2, 3 were handed out again until `recover`.
        self._leased_top = leased_top
        # The highest token this process has seen handed out. The shared counter never goes
        # back, unless its files are overwritten under a live spool (a backup restored over
        # it: `.lock` and `fence` with them); then this process goes on above what it saw
        # instead of handing its own tokens out again.
        self._seen = 0

    def _write_disk(self, value: int) -> None:
        self._write(value)
        self._lock.put(self._lock.FENCE_FILE_SLOT, self._disk_ident())

    def _moved_on_disk(self) -> None:
        """Take in a fence file rewritten by someone else than this scheme: a release from
        before it writes each token it hands out there (last token, not a ceiling), and
        alternating with one, this counter went on from its cached ceiling — tokens went
        back (3 after 1027) and were handed out twice. One stat per claim tells."""
        ident = self._disk_ident()
        if ident == self._lock.generation(self._lock.FENCE_FILE_SLOT):
            return
        try:
            disk = self._read_disk()
        except (OSError, ValueError, JobspoolError) as exc:
            # Damaged under a live spool (emptied, a directory in its place): the cached
            # counter is still right; claims go on, and the next ceiling write repairs it.
            log.warning("the fence file changed and cannot be read (%s); going on from the "
                        "counter in shared memory", exc)
            self._lock.put(self._lock.FENCE_FILE_SLOT, ident)
            return
        nxt = self._lock.generation(self._lock.FENCE_NEXT_SLOT)
        if disk > nxt:
            self._lock.put(self._lock.FENCE_NEXT_SLOT, disk)
        if disk >= self._lock.generation(self._lock.FENCE_CEILING_SLOT):
            self._lock.put(self._lock.FENCE_CEILING_SLOT, disk)  # the next take raises it
        self._lock.put(self._lock.FENCE_FILE_SLOT, ident)

    def _ceiling(self) -> int:
        ceiling = self._lock.generation(self._lock.FENCE_CEILING_SLOT)
        if ceiling == 0:
            # Nothing cached since the boot (or the map is new): restart above the disk.
            try:
                ceiling = self._read_disk()
            except FenceEmpty as exc:
                # Restarted as after a deleted file, above the clock: every writer
                # crash-looped on "fence file is not JSON" until someone ran recover. (Under
                # a live counter, `_moved_on_disk` goes on from it instead.)
                ceiling = restart_floor()
                log.warning("%s is empty after a restart: fencing tokens restart above %d "
                            "(the clock in microseconds, past any token handed out)",
                            exc.path, ceiling)
            self._lock.put(self._lock.FENCE_FILE_SLOT, self._disk_ident())
            nxt = max(self._lock.generation(self._lock.FENCE_NEXT_SLOT), ceiling)
            self._lock.put(self._lock.FENCE_NEXT_SLOT, nxt)
            if ceiling == 0:
                # A new spool: reserve the first block now so 0 never means "cached".
                ceiling = nxt + BLOCK
                self._write_disk(ceiling)
            self._lock.put(self._lock.FENCE_CEILING_SLOT, ceiling)
        return ceiling

    def take(self, n: int) -> int:
        """Hand out `n` tokens (call under the lock); returns the first of them."""
        self._ceiling()
        self._moved_on_disk()
        ceiling = self._ceiling()
        if self._leased_top is not None:
            self._seen = max(self._seen, self._leased_top())
            self._leased_top = None
        nxt = self._lock.generation(self._lock.FENCE_NEXT_SLOT)
        if nxt < self._seen:
            log.error("the fencing counter went back from %d to %d (were the spool's .lock "
                      "and fence files overwritten while it was in use?); going on above %d",
                      self._seen, nxt, self._seen)
            nxt = self._seen
        first = nxt + 1
        last = first + n - 1
        if last > ceiling:
            ceiling = last + BLOCK
            self._write_disk(ceiling)  # flushed before any of these tokens is written
            self._lock.put(self._lock.FENCE_CEILING_SLOT, ceiling)
        self._lock.put(self._lock.FENCE_NEXT_SLOT, last)
        self._seen = last
        return first

    def cached_last(self) -> int:
        """The last token this boot's shared counter handed out (0: none), without
        reading the fence file: for reports when that file cannot be read."""
        return self._lock.generation(self._lock.FENCE_NEXT_SLOT)

    def last(self) -> int:
        """The last token handed out (call under the lock)."""
        if self._lock.read_only:
            # A reader cannot refresh the cache: trust it only when it is this boot's.
            if self._lock.current_boot and self._lock.generation(self._lock.FENCE_CEILING_SLOT):
                return self._lock.generation(self._lock.FENCE_NEXT_SLOT)
            return self._read_disk()
        if self._lock.generation(self._lock.FENCE_CEILING_SLOT) == 0:
            # Not cached yet: read, without `_ceiling`'s first reservation on a new spool
            # (a write: `stats` on a full disk failed with WriteFailed). `take` reserves.
            return max(self._lock.generation(self._lock.FENCE_NEXT_SLOT), self._read_disk())
        return self._lock.generation(self._lock.FENCE_NEXT_SLOT)

    def raised(self, value: int) -> None:
        """The disk ceiling was raised to `value` (recovery): never hand out below it."""
        if self._lock.read_only:
            return
        nxt = max(self._lock.generation(self._lock.FENCE_NEXT_SLOT), value)
        self._lock.put(self._lock.FENCE_NEXT_SLOT, nxt)
        self._lock.put(self._lock.FENCE_CEILING_SLOT, value if value >= nxt else 0)
