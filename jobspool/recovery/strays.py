"""What `tmp/` holds that no live writer will publish: `recover` removes it, `fsck`
reports it. Kept apart from the store's write path (`store.py`), which it only reads
the names of."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobspool.queue import liveness
from jobspool.queue.diskerrors import listing_failed
from jobspool.queue.store import POOL_NAME, STAGE_SUFFIX


def stray_tmp_files(tmp: Path, *, max_age: float = 600.0) -> list[str]:
    """Files in `tmp/` that no live writer will publish (call under the spool lock).

    Under the lock no writer is between staging and publishing, so every `.tmp`
    staging file is a dead writer's, and so is anything else that is not a
    pre-staged `<ident>.<n>.stage` (a person's or an older version's leftover,
    directories included: only `tmp/pool/` is ours). A `.stage` file is a
    producer's, written outside the lock: it goes only when its writer's
    liveness lock is provably free, or, when its writer is unknown (no liveness
    file), once it is older than `max_age` seconds. An older version named them
    `<pid>.<n>.stage`; no live writer of this one does, so those go at once.
    """
    out: list[str] = []
    try:
        entries = list(os.scandir(tmp))
    except FileNotFoundError:
        return out
    except OSError as exc:
        raise listing_failed(exc, tmp.parent) from None
    now = time.time()
    root = tmp.parent
    verdicts: dict[str, str] = {}
    for e in entries:
        if e.is_dir(follow_symlinks=False) and e.name == POOL_NAME:
            continue
        if not e.name.endswith(STAGE_SUFFIX) or e.is_dir(follow_symlinks=False):
            out.append(e.name)
            continue
        ident = e.name.split(".", 1)[0]
        if not liveness.is_ident(ident):
            out.append(e.name)
            continue
        if ident not in verdicts:
            verdicts[ident] = liveness.probe(root, ident)[0]
        verdict = verdicts[ident]
        if verdict == liveness.Verdict.ALIVE:
            continue
        if verdict == liveness.Verdict.DEAD:
            out.append(e.name)
            continue
        try:
            if now - e.stat(follow_symlinks=False).st_mtime > max_age:
                out.append(e.name)
        except FileNotFoundError:
            continue  # published or discarded meanwhile
    return sorted(out)
