"""A ring of recent changes to `ready/`, in the lock file's shared data.

Why: each process caches the claimable jobs of `ready/` (see `index.py`)
and used to relist the whole directory whenever another process changed
it. With a deep backlog and a live producer that is a 100,000-name listing
per batch (~150 ms). Instead, every writer records, under the spool lock,
which job ids its batch added to or removed from `ready/`, tagged with the
directory's new generation; a reader that is a few generations behind
applies those entries and lists nothing.

What it guarantees: a reader uses the ring only when it holds every entry
of every generation it missed (each entry carries its batch's size, so a
torn or overwritten batch shows); anything else — a crash between the bump
and the entries, a batch larger than the ring, a reader too far behind, an
out-of-band change such as recovery's quarantine — falls back to a full
listing. Like the generations, the ring is a cache hint: never trusted
across a reboot, never a source of truth about any job.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

RING_OFFSET = 4096
SLOTS = 512
_HEADER = struct.Struct("<Q")  # entries written so far
_ENTRY = struct.Struct("<QIIcB128s")  # generation, batch size, index in batch, op, id length, id
_ENTRY_SIZE = 160
RING_BYTES = _HEADER.size + SLOTS * _ENTRY_SIZE



def _slot_offset(slot: int) -> int:
    return RING_OFFSET + _HEADER.size + slot * _ENTRY_SIZE


ADD = b"A"
REMOVE = b"R"
NOTHING = b"N"


class ChangeRing:
    """Writer and reader of the ring; every call must hold the spool lock."""

    def __init__(self, read: Callable[[int, int], bytes],
                 write: Callable[[int, bytes], None]) -> None:
        # The lock file's shared data, by position (`SpoolLock._read` / `_write`).
        self._read = read
        self._write = write

    def _count(self) -> int:
        return int(_HEADER.unpack(self._read(RING_OFFSET, _HEADER.size))[0])

    def record(self, generation: int, added: Sequence[str], removed: Sequence[str]) -> None:
        """Log one batch's changes to `ready/` under its new generation."""
        entries = [(ADD, i) for i in added] + [(REMOVE, i) for i in removed]
        if not entries:
            entries = [(NOTHING, "")]
        if len(entries) > SLOTS:
            return  # cannot be logged whole: readers see a gap and relist
        start = self._count()
        packed = []
        for n, (op, job_id) in enumerate(entries):
            raw = job_id.encode()
            packed.append(_ENTRY.pack(generation, len(entries), n, op, len(raw), raw)
                          .ljust(_ENTRY_SIZE, b"\0"))
        # One write per run of slots (two where the batch wraps past the ring's end).
        first = start % SLOTS
        head = min(len(packed), SLOTS - first)
        self._write(_slot_offset(first), b"".join(packed[:head]))
        if head < len(packed):
            self._write(_slot_offset(0), b"".join(packed[head:]))
        self._write(RING_OFFSET, _HEADER.pack(start + len(entries)))

    def since(self, seen: int, now: int) -> list[tuple[bytes, str]] | None:
        """The (op, id) changes of generations `seen+1 .. now` in order, or None when the
        ring does not hold all of them (the caller must relist)."""
        missed = now - seen
        if missed == 0:
            return []
        if missed < 0 or missed > SLOTS:
            # Backwards: the counters started over (`.lock` emptied or replaced), and what
            # the caller saw is no measure of what changed since.
            return None
        count = self._count()
        held = min(count, SLOTS)
        ring = self._read(_slot_offset(0), (SLOTS if count > SLOTS else held) * _ENTRY_SIZE)
        by_gen: dict[int, list[tuple[int, int, bytes, str]]] = {}
        for k in range(count - held, count):
            gen, size, idx, op, length, raw = _ENTRY.unpack_from(ring, (k % SLOTS) * _ENTRY_SIZE)
            if seen < gen <= now:
                try:
                    job_id = raw[:length].decode()
                except UnicodeDecodeError:
                    return None  # torn or overwritten: relist
                by_gen.setdefault(gen, []).append((idx, size, op, job_id))
        out: list[tuple[bytes, str]] = []
        for gen in range(seen + 1, now + 1):
            batch = sorted(by_gen.get(gen, []))
            if not batch or len(batch) != batch[0][1] or [b[0] for b in batch] != list(
                    range(len(batch))):
                return None
            out.extend((op, job_id) for _, _, op, job_id in batch if op != NOTHING)
        return out
