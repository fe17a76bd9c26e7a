"""The physical reference: the bare filesystem operations a job's life needs.

A file queue cannot beat these, so every jobspool figure can be read as a
fraction of them. The life of one job is taken as its least durable footprint:
one new 1 KB file written and fsynced (enqueue), three renames between state
directories (ready, leased, done) and one fsync of the destination directory
after each. Batched, B jobs share each directory fsync; the file fsyncs are
either one per file or, with ``syncfs(2)``, one flush of the filesystem for
the whole batch's new files. The limit quoted is the faster of the two.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from typing import Any

DATA = b"x" * 1024


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create(path: str, sync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, DATA)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs_fn() -> Any:
    """``syncfs(fd)`` from libc (Python has no wrapper), or None where it is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syncfs
    except (OSError, AttributeError):
        return None


def _dirs(root: str) -> dict[str, str]:
    d = {s: os.path.join(root, s) for s in ("tmp", "ready", "leased", "done")}
    for p in d.values():
        os.makedirs(p, exist_ok=True)
    return d


def _life(d: dict[str, str], names: list[str], syncfs: Any = None) -> None:
    """Enqueue, claim and complete ``names`` as one batch with bare file operations."""
    for n in names:
        _create(os.path.join(d["tmp"], n), sync=syncfs is None)
    if syncfs is not None:
        fd = os.open(d["tmp"], os.O_RDONLY | os.O_DIRECTORY)
        try:
            if syncfs(fd) != 0:
                raise OSError(ctypes.get_errno(), "syncfs failed")
        finally:
            os.close(fd)
    for src, dst in (("tmp", "ready"), ("ready", "leased"), ("leased", "done")):
        for n in names:
            os.rename(os.path.join(d[src], n), os.path.join(d[dst], n))
        _fsync_dir(d[dst])


def measure(root: str, n: int, batch: int) -> dict[str, Any]:
    """Measure each bare operation ``n`` times and a job's life, one at a time and batched."""
    out: dict[str, Any] = {}
    d = _dirs(root)
    os.sync()

    t = time.perf_counter()
    for k in range(n):
        _create(os.path.join(d["tmp"], f"c{k}"))
    out["create_write_fsync_ops"] = n / (time.perf_counter() - t)

    t = time.perf_counter()
    for k in range(n):
        os.rename(os.path.join(d["tmp"], f"c{k}"), os.path.join(d["ready"], f"c{k}"))
    out["rename_ops"] = n / (time.perf_counter() - t)

    # A directory fsync costs most right after a rename into it, as on the hot path.
    src, dst = d["ready"], d["leased"]
    t = time.perf_counter()
    for k in range(n):
        os.rename(os.path.join(src, f"c{k}"), os.path.join(dst, f"c{k}"))
        _fsync_dir(dst)
    elapsed = time.perf_counter() - t
    out["rename_dir_fsync_ops"] = n / elapsed
    out["dir_fsync_ops"] = 1 / max(elapsed / n - 1 / out["rename_ops"], 1e-9)

    t = time.perf_counter()
    for k in range(n):
        _life(d, [f"j{k}"])
    out["life_1_jobs"] = n / (time.perf_counter() - t)

    total = max(n, batch) // batch * batch
    t = time.perf_counter()
    for k in range(0, total, batch):
        _life(d, [f"b{j}" for j in range(k, k + batch)])
    out["life_batch_fsync_jobs"] = total / (time.perf_counter() - t)

    syncfs = _syncfs_fn()
    if syncfs is not None:
        t = time.perf_counter()
        for k in range(0, total, batch):
            _life(d, [f"s{j}" for j in range(k, k + batch)], syncfs=syncfs)
        out["life_batch_syncfs_jobs"] = total / (time.perf_counter() - t)
    out["life_batch_jobs"] = max(out["life_batch_fsync_jobs"], out.get("life_batch_syncfs_jobs", 0))
    out["batch"] = batch

    shutil.rmtree(root, ignore_errors=True)
    return out
