"""This process's id, without a system call per question.

Forks are detected on the hot path (a child must not share its parent's
descriptors or locks) by comparing a saved pid with the current one. glibc no
longer caches `getpid()`, and a durable enqueue asked eight times: eight
system calls, measurable on a VM where each costs microseconds. The pid is
read once and again in every child `os.fork()` makes (`register_at_fork`,
which multiprocessing's fork start method goes through).
"""

from __future__ import annotations

import os

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def current_pid() -> int:
    """`os.getpid()`, cached (refreshed in a forked child)."""
    return _pid


__all__ = ["current_pid"]
