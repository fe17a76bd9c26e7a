"""Who may read and write a spool: the modes of its directories and files.

A spool holds payloads and results, so a new one is private to its owner
(directories 0700, files 0600). `access="group"` shares it with the owner's
group instead (0770 with setgid, so new entries keep the group; files 0660):
several service users in one group, each running workers. `access="group-read"`
lets the group read but not write (02750, files 0640): a cron health check or a
metrics exporter in that group inspects the spool and can change nothing. The
choice is saved in `spool.json` and every file jobspool writes gets that mode
whatever the process umask says (a umask can only remove bits, so we restore
them with `fchmod` when it would have) — which is why a one-time `chmod` of a
spool does not last: files written later get the saved mode.

Opening a spool whose directories other users may write is refused: anyone
could plant jobs in `ready/` (that a worker would run) or swap files in `tmp/`.
So is one whose `.lock`, `fence` or `spool.json` they may write (fencing tokens
and settings live there).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from jobspool.errors import SpoolError

ACCESS_MODES: dict[str, tuple[int, int]] = {
    "private": (0o700, 0o600),
    "group": (0o2770, 0o660),
    "group-read": (0o2750, 0o640),
}
DEFAULT_ACCESS = "private"

_umask: int | None = None


def validate_access(access: object) -> str:
    if access not in ACCESS_MODES:
        raise SpoolError(f"access must be one of {', '.join(map(repr, ACCESS_MODES))}, "
                         f"got {access!r}")
    assert isinstance(access, str)
    return access


def dir_mode(access: str) -> int:
    return ACCESS_MODES[access][0]


def file_mode(access: str) -> int:
    return ACCESS_MODES[access][1]


def process_umask() -> int:
    """The process umask, read without changing it (os.umask would, racing other threads)."""
    global _umask
    if _umask is None:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("Umask:"):
                        _umask = int(line.split()[1], 8)
                        break
        except (OSError, ValueError):
            pass
        if _umask is None:
            _umask = 0o077  # unknown: assume the strictest and always restore the bits
    return _umask


def forget_umask() -> None:
    """Read the umask again on next use (after a caller changed it)."""
    global _umask
    _umask = None


def needs_fix(mode: int) -> bool:
    """Whether the umask strips bits from `mode` (then new files need an fchmod)."""
    return bool(mode & 0o777 & process_umask())


def set_fd_mode(fd: int, mode: int, *, may_exist: bool = False) -> None:
    """Give a file just made exactly `mode`. The umask is read once (reading it costs a
    /proc read); when it looked harmless the file's own mode is asked (one fstat): a
    handler's `os.umask()` made later left job files without the spool's mode (0600 in a
    group-read spool; 0 under umask 0777: unreadable, and quarantined by `recover`).
    `may_exist`: a file opened with O_CREAT that may be an old one (the lock file), whose
    mode an operator may have set on purpose (a one-time read grant): only what the
    umask strips is put back."""
    if needs_fix(mode) or (not may_exist and stat.S_IMODE(os.fstat(fd).st_mode) != mode):
        os.fchmod(fd, mode)


def make_dir(path: Path, mode: int) -> None:
    """mkdir with exactly `mode` (raises FileExistsError like mkdir)."""
    path.mkdir(mode=mode & 0o777)
    if needs_fix(mode) or mode & ~0o777 or stat.S_IMODE(path.stat().st_mode) != mode:
        os.chmod(path, mode)


def refuse_foreign_writers(path: Path, st: os.stat_result) -> None:
    """Refuse a spool directory or control file that users other than the owner and group
    may write."""
    if st.st_mode & stat.S_IWOTH:
        what = "plant or swap jobs" if stat.S_ISDIR(st.st_mode) else "forge the spool's state"
        raise SpoolError(
            f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}); anyone "
            f"could {what}: run `chmod o-w {path}`", path=str(path))
