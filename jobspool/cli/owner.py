"""Run as root on a spool another user owns, a command acts as that user.

Why: `sudo jobspool requeue --all-dead` on a spool a service account owns
wrote root-owned files into it: job files the service could not read, and
recycled files (`tmp/pool/`) it could not reuse, so its worker failed five
times on EACCES and stopped, while `fsck` and `health` said all was well.
A delivery agent run as root (Postfix's local, maildrop) writes a mailbox
as its owner for the same reason. Here the process takes the owner's user
and groups for good (not only the effective ids: a handler run by this
process cannot take root back) before it opens the spool.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

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
    name = str(uid)
    try:
        import pwd

        entry = pwd.getpwuid(uid)
        name, gid = entry.pw_name, entry.pw_gid
        groups = os.getgrouplist(name, gid)
    except KeyError:
        pass  # no passwd entry: the directory's group is all we know
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    log.info("running as %s (uid %d), the owner of %s", name, uid, root)
