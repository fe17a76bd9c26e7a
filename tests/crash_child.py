"""A worker process for the SIGKILL tests: boot recovery, then claim/complete in a loop.

Usage: python tests/crash_child.py ROOT LOG SEED NAME

It opens the spool (settings come from spool.json), runs `recover()` as
every process does on boot — while its siblings keep working — and then
claims batches of random size until no job is left to run. Most leases are
completed; some are failed (retryable), released or heartbeated first, so
that a kill can land in the middle of any kind of state change.

It appends one line per acknowledged outcome to LOG, after the spool call
returned: `C <job_id> <token>` for a completion, `F`, `R`, `L` (lease lost)
likewise. A line is flushed at once, so a SIGKILL loses at most the line of
a call that had not returned. The parent reads the logs to check that no job
was ever completed twice under the same token.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jobspool import Spool  # noqa: E402
from jobspool.errors import LeaseLost  # noqa: E402

LIVE = ("ready", "retryable", "leased")


def work_left(root: Path) -> bool:
    return any(os.listdir(root / d) for d in LIVE)


def main(argv: list[str]) -> int:
    root, log_path, seed, name = Path(argv[0]), argv[1], int(argv[2]), argv[3]
    rng = random.Random(seed)
    spool = Spool(root, create=False, durable=False, seed=seed)
    spool.recover()
    pid = os.getpid()
    with open(log_path, "a", buffering=1) as log:
        log.write(f"B {pid}\n")
        while True:
            leases = spool.claim(limit=rng.randint(1, 8), owner=f"{name}:{pid}")
            if not leases:
                if not work_left(root):
                    return 0
                time.sleep(0.005)  # leases of killed siblings expire soon
                continue
            done = []
            for lease in leases:
                r = rng.random()
                try:
                    if r < 0.06:
                        spool.fail(lease, "flaky")
                        log.write(f"F {lease.job_id} {lease.token}\n")
                        continue
                    if r < 0.09:
                        spool.release(lease)
                        log.write(f"R {lease.job_id} {lease.token}\n")
                        continue
                    if r < 0.15:
                        lease = spool.heartbeat(lease)
                except LeaseLost:
                    log.write(f"L {lease.job_id} {lease.token}\n")
                    continue
                done.append(lease)
            outcomes = spool.complete_many([(lease, {"token": lease.token, "by": pid})
                                            for lease in done])
            for lease, outcome in zip(done, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    tag = "L" if isinstance(outcome, LeaseLost) else "E"
                else:
                    tag = "C"
                log.write(f"{tag} {lease.job_id} {lease.token}\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
