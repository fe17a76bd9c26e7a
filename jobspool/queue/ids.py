"""Job ids and reservation ids.

Job ids are ULID-like so that their lexicographic order is creation order:
FIFO among equal priorities needs no file reads (the claim index sorts by
name).
"""

from __future__ import annotations

import os
import threading
import time

_id_lock = threading.Lock()


def _reset_after_fork() -> None:
    # A fork while another thread held the lock left the child's copy held for ever: the
    # child's first enqueue hung. (Its sequence state carries over: ids stay unique, the
    # random bits differ.)
    global _id_lock
    _id_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
_last_ms = 0
_seq = 0
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [_CROCKFORD[i >> 5] + _CROCKFORD[i & 31] for i in range(1024)]


def new_job_id() -> str:
    """A ULID-like id: 48-bit ms timestamp + 80 random bits, monotonic within a process.

    Lexicographic order is creation order across processes to the millisecond,
    and strictly so within one process, so FIFO needs no file reads.
    """
    global _last_ms, _seq
    with _id_lock:
        ms = int(time.time() * 1000)
        if ms <= _last_ms:
            ms = _last_ms
            _seq += 1
            low = int.from_bytes(os.urandom(5), "big")
        else:
            _last_ms = ms
            both = int.from_bytes(os.urandom(10), "big")  # one system call, not two
            _seq = (both >> 40) >> 1  # room to count up
            low = both & ((1 << 40) - 1)
        rand = (_seq << 40) | low
    value = (ms << 80) | (rand & ((1 << 80) - 1))
    # 26 Crockford digits, two at a time from a table: half the time of one at a time.
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in range(120, -1, -10)])


def new_token_id() -> str:
    """A random id for one reservation of a prepared job."""
    return os.urandom(8).hex()


__all__ = ["new_job_id", "new_token_id"]
