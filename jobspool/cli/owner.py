"""Run as root on a spool another user owns, a command that writes acts as that user.

Why: `sudo jobspool requeue --all-dead` on a spool a service account owns
wrote root-owned files into it: job files the service could not read, and
recycled files (`tmp/pool/`) it could not reuse, so its worker failed five
times on EACCES and stopped, while `fsck` and `health` said all was well.
A delivery agent run as root (Postfix's local, maildrop) writes a mailbox
as its owner for the same reason. Here the process takes the owner's user
and groups for good (not only the effective ids: a handler run by this
process cannot take root back) before it opens the spool.

Commands that only read (`stats`, `list`, `show`, `health`, `fsck`...) stay
root: they write nothing. And the switch needs the owner to be able to read
this Python (a module imported after it is read as the owner): one installed
under root's private home (`/root/.pyenv`) is not, and the command is then
refused in one line rather than fail at its next import with a traceback.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from jobspool.errors import SpoolError

log = logging.getLogger("jobspool.cli")


def act_as_owner(root: Path) -> None:
    """Become the owner of the spool directory `root` when we are root and it is not."""
    if os.geteuid() != 0:
        return
    try:
        st = os.stat(root)
    except OSError:
        return  # not there yet (`init` creates it, as root): nothing to defer to
    if st.st_uid == 0:
        return
    uid, gid = st.st_uid, st.st_gid
    groups = [gid]
    name = f"uid {uid}"
    try:
        import pwd

        entry = pwd.getpwuid(uid)
        name, gid = entry.pw_name, entry.pw_gid
        groups = os.getgrouplist(name, gid)
    except KeyError:
        pass  # no passwd entry: the directory's group is all we know
    hidden = next((p for p in _code_dirs() if not _reachable(p, uid, set(groups))), None)
    if hidden is not None:
        raise SpoolError(f"{root} belongs to {name}: run this command as {name} (files root "
                         f"writes there stop its workers; and {name} cannot read this "
                         f"Python's {hidden}, so jobspool cannot switch to {name} itself)",
                         path=str(root))
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    log.info("running as %s (uid %d), the owner of %s", name, uid, root)


def _code_dirs() -> list[str]:
    """Where the modules a command may still import live: the standard library, its
    compiled modules, and the packages of jobspool and its dependencies."""
    import anyio
    import orjson

    import jobspool

    dirs = [os.path.dirname(os.__file__), os.path.dirname(jobspool.__file__),
            os.path.dirname(os.path.dirname(anyio.__file__)),
            os.path.dirname(os.path.dirname(orjson.__file__ or ""))]
    dynload = os.path.join(os.path.dirname(os.__file__), "lib-dynload")
    if os.path.isdir(dynload):
        dirs.append(dynload)
    return [d for d in dict.fromkeys(dirs) if d]


def _reachable(path: str, uid: int, gids: set[int]) -> bool:
    """Whether user `uid` (groups `gids`) may enter every directory down to `path` and
    list `path` itself, by the mode bits (no ACLs)."""
    parts = Path(os.path.abspath(path)).parts
    for i in range(1, len(parts) + 1):
        here = os.path.join(*parts[:i])
        try:
            st = os.stat(here)
        except OSError:
            return False
        need = stat.S_IXOTH | (stat.S_IROTH if i == len(parts) else 0)
        if st.st_uid == uid:
            need <<= 6
        elif st.st_gid in gids:
            need <<= 3
        if st.st_mode & need != need:
            return False
    return True
