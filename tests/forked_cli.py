"""Run the CLI in a forked child, as `nobody` when asked and we are root, and collect its
exit code, output and final uid. Forked rather than exec'd: the interpreter's own files may
be out of `nobody`'s reach (root's private home), and the child inherits every module the
parent loaded. The parent must have run the same commands once itself (warm imports)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from tests.cli_harness import run_cli


def forked_cli(argv: list[str], *, as_nobody: bool,
               before: Callable[[], None] | None = None) -> dict[str, Any]:
    """`before` runs in the child first (a patch the test needs), still as root."""
    def cli() -> dict[str, Any]:
        code, printed, complained = run_cli(*argv)
        return {"code": code, "out": printed, "err": complained}

    return forked_call(cli, as_nobody=as_nobody, before=before)


def forked_call(call: Callable[[], dict[str, Any]], *, as_nobody: bool,
                before: Callable[[], None] | None = None) -> dict[str, Any]:
    """`call()`'s dict, run in a forked child (as `nobody` when asked and we are root), with
    the child's final "uid"; what it raised is "raised": "module.Type: message"."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        doc: dict[str, Any] = {"code": 99, "out": "", "err": ""}
        try:
            os.close(read_fd)
            if before is not None:
                before()
            if as_nobody and os.geteuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
            doc.update(call())
        except BaseException as exc:  # report, do not hang the parent
            doc["err"] += f"child raised {exc!r}"
            doc["raised"] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        finally:
            doc["uid"] = os.geteuid()
            os.write(write_fd, orjson.dumps(doc))
            os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 1 << 16):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    got = orjson.loads(b"".join(chunks))
    assert isinstance(got, dict)
    return got


@contextlib.contextmanager
def reachable_root() -> Iterator[Path]:
    """A spool path outside pytest's private temp tree, so that `nobody` can reach it;
    every directory under it is made searchable again before it is removed."""
    base = Path(tempfile.mkdtemp(prefix="jobspool-denied-"))
    os.chmod(base, 0o755)
    try:
        yield base / "spool"
    finally:
        for dirpath, dirs, _files in os.walk(base):
            for name in dirs:
                os.chmod(os.path.join(dirpath, name), 0o755)
        shutil.rmtree(base)


def deny_to_caller(root: Path, relative: str) -> None:
    """Make `root/relative` unreadable and unsearchable for whoever runs the forked call:
    as root, the spool is given to `nobody` and that one entry kept root's, mode 0;
    otherwise, mode 0 alone."""
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        for dirpath, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(dirpath, name), nobody.pw_uid, nobody.pw_gid)
        os.lchown(root, nobody.pw_uid, nobody.pw_gid)
        os.chown(root / relative, 0, 0)
    os.chmod(root / relative, 0)
