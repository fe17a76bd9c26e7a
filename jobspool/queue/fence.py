"""The spool-wide fencing counter, `<root>/fence`.

Every claim takes the next tokens from it under the spool lock and writes
the new value in the same store batch as the leased job files, through the
same tmp-fsync-rename sequence: so a token is never handed out (and written
into a job) without the counter that covers it being durable too, and
tokens are strictly increasing across processes and restarts.

What it does not protect against: someone editing or deleting the file.
`fsck` checks that the counter is above every token found on disk and
`recover` raises it if not.
"""

from __future__ import annotations

import orjson

FENCE_FILE = "fence"
FENCE_FORMAT = 1


def encode_fence(value: int) -> bytes:
    return orjson.dumps({"v": FENCE_FORMAT, "fence": value})


def decode_fence(data: bytes) -> int:
    """Parse the fence file; raise ValueError when it is unreadable (never guess a value:
    a guess too low would hand out a token twice)."""
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ValueError("fence file is not JSON") from None
    if isinstance(d, dict):
        value = d.get("fence")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    raise ValueError("fence file has no non-negative integer 'fence'")
