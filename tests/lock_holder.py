"""Another process holding a spool's lock, for tests of what waits on it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# A legitimate holder: a claim's `fenced` block (the spool lock held until it ends).
_FENCED = """
import sys, time
from jobspool import Spool
with Spool(sys.argv[1]) as spool:
    spool.enqueue("hold", {})
    lease = spool.claim(kinds=["hold"], lease_seconds=600)[0]
    with spool.fenced(lease):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
"""

# Only the spool directory's flock, the second half of the spool lock's take.
_DIRECTORY = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@contextmanager
def holding_lock(root: Path, seconds: float = 600.0, *, directory_only: bool = False
                 ) -> Iterator[subprocess.Popen[bytes]]:
    """Another process holds `root`'s spool lock (inside a fenced block, or only the
    directory's flock) from entry until `seconds` pass or the block ends."""
    script = _DIRECTORY if directory_only else _FENCED
    holder = subprocess.Popen([sys.executable, "-c", script, str(root), str(seconds)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n", \
            holder.communicate()[1]
        yield holder
    finally:
        holder.kill()
        holder.communicate()
