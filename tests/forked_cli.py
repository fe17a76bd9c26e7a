"""Run the CLI in a forked child, as `nobody` when asked and we are root, and collect its
exit code, output and final uid. Forked rather than exec'd: the interpreter's own files may
be out of `nobody`'s reach (root's private home), and the child inherits every module the
parent loaded. The parent must have run the same commands once itself (warm imports)."""

from __future__ import annotations

import io
import os
import pwd
from collections.abc import Callable
from typing import Any

import orjson

from tests.cli_harness import run_cli


def forked_cli(argv: list[str], *, as_nobody: bool,
               before: Callable[[], None] | None = None) -> dict[str, Any]:
    """`before` runs in the child first (a patch the test needs), still as root."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code, out, err = 99, io.StringIO(), io.StringIO()
        try:
            os.close(read_fd)
            if before is not None:
                before()
            if as_nobody and os.geteuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
            code, printed, complained = run_cli(*argv)
            out.write(printed)
            err.write(complained)
        except BaseException as exc:  # report, do not hang the parent
            err.write(f"child raised {exc!r}")
        finally:
            os.write(write_fd, orjson.dumps({"code": code, "out": out.getvalue(),
                                             "err": err.getvalue(), "uid": os.geteuid()}))
            os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 1 << 16):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    doc = orjson.loads(b"".join(chunks))
    assert isinstance(doc, dict)
    return doc
