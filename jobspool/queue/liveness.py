"""Process liveness in a spool: `live/<ident>.lock`, flock-held for a process's life.

Every process that writes a spool registers once per spool: a random
`ident` (unique across objects, threads, processes and PID namespaces — a
pid is not: containers sharing a volume are all PID 1) names its staging
files and its leases, and an exclusive `flock` on its liveness file is held
until the process exits. The kernel drops that lock when the process dies,
however it dies (SIGKILL included), so any process on the same host can tell
a live writer from a dead one by trying the lock — across PID namespaces too,
where a pid lookup (`kill(pid, 0)`) sees nothing or the wrong process.

Verdicts are three-valued: alive (the lock is held), dead (the file is there
and nobody holds its lock, on this host: after a reboot nobody does), or
unknown (no file: never registered here, or already cleaned up). Only
"dead" lets recovery act early; "unknown" waits for lease expiry and file age.

The file also says which fencing tokens have a handler running (`running`),
rewritten in place (no flush: a process crash keeps the page cache) when a
handler starts or ends. When the process has died, recovery charges a rescue
only to the jobs whose handlers were running, and gives the batch mates that
never started back uncounted. A process that never reported a start (a bare
`claim` loop doing the work itself, not a `Worker`) says `running: null`:
nothing tells its idle leases from its busy ones, so every one is charged —
else a job that kills such a process would come back uncounted forever.

A dead verdict needs the file to come from this kernel (the same boot id,
which containers on one host share whatever their hostnames) or from this
hostname (before a reboot, when every process died); another machine's file
is "unknown". What it does not cover: a spool shared between hosts (not
supported: flock is not coherent over NFS), and a process frozen (SIGSTOP) —
alive, so its leases are left to expire as usual.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import orjson

from jobspool.queue.perms import set_fd_mode

LIVE_DIR = "live"
LIVE_SUFFIX = ".lock"

_lock = threading.Lock()
# Keyed by the root directory's identity (device, inode), not its path: the mark is one
# file, live/<ident>.lock, however the root is spelled. Keyed by realpath, a process that
# opened one spool through a bind mount and its own path made two marks on that file; the
# second replaced the first, and closing it left the file unlocked while the first still
# held a lease: another process then took the live holder for dead and reclaimed its job.
LiveKey = tuple[int, int]
_marks: dict[LiveKey, ProcessMark] = {}
_open_spools: dict[LiveKey, int] = {}  # open spools per root in this process
_by_given: dict[tuple[object, str], ProcessMark] = {}  # mark_for's cache, by the root as given
_ident = ""


def _new_ident() -> str:
    return os.urandom(8).hex()


def is_ident(text: str) -> bool:
    """Whether `text` has the shape of an ident `_new_ident` makes (16 lowercase hex digits):
    an older version named staging files after pids, which never do."""
    return len(text) == 16 and all(c in "0123456789abcdef" for c in text)


def process_ident() -> str:
    """This process's identity in every spool (new after a fork)."""
    global _ident
    if not _ident:
        _ident = _new_ident()
    return _ident


def _after_fork_in_child() -> None:
    global _ident, _lock
    _ident = ""
    _lock = threading.Lock()  # a parent's thread may have held it at the fork
    # The child must not keep the parent's liveness locks alive: flock locks belong to the
    # open file description, which fork shares. Drop our copies without unlocking.
    for mark in _marks.values():
        with contextlib.suppress(OSError):
            os.close(mark.fd)
    _marks.clear()
    _by_given.clear()
    _open_spools.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _key(root: Path) -> LiveKey:
    st = os.stat(root)
    return (st.st_dev, st.st_ino)


def retain(root: Path) -> LiveKey:
    """A spool on `root` was opened in this process; returns the key `release` takes."""
    key = _key(root)
    with _lock:
        _open_spools[key] = _open_spools.get(key, 0) + 1
    return key


def release(key: LiveKey) -> None:
    """A spool `retain` counted was closed. With the last one on its root, this process's
    mark there goes as at exit (kept, unlocked, while a lease still names it): a process
    that opened and closed spools on many roots held a descriptor for each until it
    exited (a long-lived service of many tenants ran out of them)."""
    with _lock:
        left = _open_spools.get(key, 0) - 1
        if left > 0:
            _open_spools[key] = left
            return
        _open_spools.pop(key, None)
        mark = _marks.pop(key, None)
        if mark is None:
            return
        for given in [g for g, m in _by_given.items() if m is mark]:
            del _by_given[given]
    _drop(mark)


def _drop(mark: ProcessMark) -> None:
    if not (mark.claimed and _named_by_a_lease(mark)):
        with contextlib.suppress(OSError):
            os.unlink(mark.path)
    with contextlib.suppress(OSError):
        os.close(mark.fd)


@atexit.register
def _remove_own_marks() -> None:
    # An exit that leaves nothing to attribute removes the file; a crash skips this and
    # leaves the unlocked file that tells recovery this process is gone. So does an exit
    # (an uncaught exception, sys.exit) that leaves leases naming this process: removed,
    # its verdict was "unknown", and its leases waited out lease_seconds instead of being
    # reclaimed at once (and `migrate` refused, taking it for a live worker).
    for mark in list(_marks.values()):
        _drop(mark)
    _marks.clear()
    _by_given.clear()


def _named_by_a_lease(mark: ProcessMark) -> bool:
    """Whether a job in `leased/` still holds a lease of this process (only asked, at exit,
    of a process that claimed: a producer never reads the directory)."""
    needle = mark.ident.encode()
    try:
        with os.scandir(mark.path.parent.parent / "leased") as entries:
            for entry in entries:
                try:
                    with open(entry.path, "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                if needle not in data:
                    continue
                try:
                    doc = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                lease = doc.get("lease") if isinstance(doc, dict) else None
                if isinstance(lease, dict) and lease.get("proc") == mark.ident:
                    return True
    except OSError:
        return False
    return False


_boot_id: str | None = None


def boot_id() -> str:
    """This kernel's boot id ("" when unknown): shared by every container on the host."""
    global _boot_id
    if _boot_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                _boot_id = f.read().strip()
        except OSError:
            _boot_id = ""
    return _boot_id


class ProcessMark:
    """This process's liveness file in one spool (see the module docstring)."""

    def __init__(self, root: Path, ident: str, mode: int) -> None:
        self.ident = ident
        self.path = root / LIVE_DIR / f"{ident}{LIVE_SUFFIX}"
        # Created under a temporary name and locked before it takes its real name, so
        # nobody can ever see the real name unlocked while this process lives.
        tmp = self.path.with_name(f"{ident}.new")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
        try:
            set_fd_mode(fd, mode)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.fd = fd
            self._running: dict[int, int] = {}
            self._reports = False  # until `running` is first called: see the module docstring
            self.claimed = False  # set by a claim: this process's exit then looks for its leases
            self._guard = threading.Lock()
            self._base = {"pid": os.getpid(), "host": socket.gethostname(), "boot": boot_id(),
                          "started": time.time()}
            self._write()
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _write(self) -> None:
        doc = dict(self._base, running=sorted(self._running) if self._reports else None)
        data = orjson.dumps(doc)
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def running(self, tokens: Iterable[int], *, started: bool) -> None:
        """Record that handlers for `tokens` started (or ended); cheap, no flush. Called
        with no tokens, it declares that this process reports every handler it starts."""
        with self._guard:
            self._reports = True
            for t in tokens:
                if started:
                    self._running[t] = self._running.get(t, 0) + 1
                elif self._running.get(t, 0) > 1:
                    self._running[t] -= 1
                else:
                    self._running.pop(t, None)
            with contextlib.suppress(OSError):
                self._write()


def mark_for(root: Path, mode: int = 0o600) -> ProcessMark:
    """This process's mark in the spool at `root`, registering it on first use."""
    # Asked on every enqueue: the root as given is looked up first (no stat). Keyed by
    # process as well: a forked child has its own mark.
    fast = (root, process_ident())
    mark = _by_given.get(fast)
    if mark is not None:
        return mark
    key = _key(root)
    with _lock:
        mark = _marks.get(key)
        if mark is None:
            mark = ProcessMark(Path(os.path.realpath(root)), process_ident(), mode)
            _marks[key] = mark
        _by_given[fast] = mark
        return mark


class Verdict:
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


def probe(root: Path, ident: str) -> tuple[str, dict[str, object] | None]:
    """Whether the process `ident` lives, and what its file says (only when dead)."""
    if ident == _ident:
        return Verdict.ALIVE, None  # ourselves (in a copied spool, the file is not our lock)
    path = root / LIVE_DIR / f"{ident}{LIVE_SUFFIX}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return Verdict.UNKNOWN, None
    except OSError:
        return Verdict.UNKNOWN, None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return Verdict.ALIVE, None
            return Verdict.UNKNOWN, None
        try:
            doc = orjson.loads(os.pread(fd, 1 << 20, 0))
        except (orjson.JSONDecodeError, OSError):
            doc = None
        if not isinstance(doc, dict):
            return Verdict.DEAD, None
        if doc.get("boot") and doc.get("boot") == boot_id():
            # The same kernel, since the same boot: its flock is the truth, whatever the
            # hostname says (containers sharing a volume each have their own).
            return Verdict.DEAD, doc
        if doc.get("host") not in (None, socket.gethostname()):
            return Verdict.UNKNOWN, None  # another machine's process: nothing to prove here
        return Verdict.DEAD, doc  # this host before a reboot: every process then is gone
    finally:
        os.close(fd)


def running_tokens(doc: dict[str, object] | None) -> set[int] | None:
    """The tokens a dead process was running handlers for (None: not recorded)."""
    if doc is None:
        return None
    raw = doc.get("running")
    if not isinstance(raw, list):
        return None
    return {t for t in raw if isinstance(t, int) and not isinstance(t, bool)}


def dead_marks(root: Path) -> list[str]:
    """Idents whose liveness file is there but unlocked: their processes are gone."""
    try:
        names = os.listdir(root / LIVE_DIR)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if name.endswith(LIVE_SUFFIX):
            ident = name[: -len(LIVE_SUFFIX)]
            if probe(root, ident)[0] == Verdict.DEAD:
                out.append(ident)
    return sorted(out)


def alive_others(root: Path) -> list[dict[str, object]]:
    """What the live liveness files of other processes say (pid, host, started): every
    process that has this spool open for writing right now, this one excepted."""
    try:
        names = os.listdir(root / LIVE_DIR)
    except OSError:
        return []
    out: list[dict[str, object]] = []
    for name in sorted(names):
        ident = name[: -len(LIVE_SUFFIX)] if name.endswith(LIVE_SUFFIX) else None
        if ident is None or ident == _ident or probe(root, ident)[0] != Verdict.ALIVE:
            continue
        try:
            doc = orjson.loads((root / LIVE_DIR / name).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            doc = None
        out.append(doc if isinstance(doc, dict) else {})
    return out


def remove_dead(root: Path, ident: str) -> bool:
    """Delete a dead process's file, only while holding its lock (never a live one's)."""
    path = root / LIVE_DIR / f"{ident}{LIVE_SUFFIX}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    finally:
        os.close(fd)


def stale_new_files(root: Path, max_age: float = 60.0) -> list[str]:
    """`<ident>.new` files of processes that died while registering."""
    d = root / LIVE_DIR
    try:
        names = [n for n in os.listdir(d) if n.endswith(".new")]
    except FileNotFoundError:
        return []
    out = []
    now = time.time()
    for n in names:
        try:
            if now - os.stat(d / n).st_mtime > max_age:
                out.append(n)
        except FileNotFoundError:
            continue
    return out
