"""The names the store writes under: the job file suffix, the scratch directories of
`tmp/`, and the staging names that tell recovery whose file it is.

Kept apart from `store.py` so that readers of a spool (scans, fsck, health, stats)
can name its files without the write path; `store.py` re-exports every name here.
"""

from __future__ import annotations

import itertools

from jobspool.queue import liveness

JOB_SUFFIX = ".json"


def ignored_name(name: str) -> bool:
    """Hidden files (an editor's swap file, `.DS_Store`, rsync's temporaries) and editor
    backups (`x.json~`) in a state directory are never jobs (an id starts with a letter
    or digit): left alone by every reader, `fsck` and `recover`, as Maildir does."""
    return name.startswith(".") or name.endswith("~")


TMP_DIR = "tmp"
STAGE_SUFFIX = ".stage"
POOL_DIR = "tmp/pool"
POOL_NAME = "pool"  # POOL_DIR's name inside tmp/
# Recycled files producers leave in the pool for settles (see `Store.prestage`).
POOL_RESERVE = 16
# One counter for every Store of the process: with the process's random ident it makes
# staging names unique across Spool objects, threads, processes and PID namespaces.
_COUNTER = itertools.count()


def staging_name(suffix: str = "") -> str:
    """`<process ident>.<n><suffix>`: unique, and tells recovery whose file it is."""
    return f"{liveness.process_ident()}.{next(_COUNTER)}{suffix}"
