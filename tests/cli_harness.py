"""The one way tests run the `jobspool` command line: in-process or as a real process.

- `run_cli(*args, root=..., env=..., stdin=...) -> Result` calls `jobspool.cli.main` in this
  process with stdout/stderr captured (fast; what most command tests need).
- `run_jobspool(*args, root=..., env=..., stdin=..., timeout=..., prefix=...) -> Result` runs
  `python -m jobspool` as a real process and waits for it (exit codes, one-line errors, no
  traceback: what only a real process shows).
- `start_jobspool(*args, ...) -> Popen` starts one and returns at once (workers, signals), and
  `LineReader(proc.stderr).wait_for(pattern)` waits for a line it prints (a readiness signal).
- `one_error_line(result)`: the single `jobspool: error: ...` line a failing command prints.

`root` puts `--root ROOT` before the arguments. `env` holds variables to set on top of the test's
environment (None unsets one); the environment always has the source tree importable and no
ambient `JOBSPOOL_ROOT`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import pytest

from tests.subproc import REPO, cli_env

Env = Mapping[str, str | None]


@dataclass(frozen=True)
class Result:
    """What one command did: its exit code and everything it printed."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        """stdout as the one JSON document `--json` promises."""
        return orjson.loads(self.out)

    def __iter__(self) -> Iterator[Any]:
        """`code, out, err = run_cli(...)`."""
        return iter((self.code, self.out, self.err))

    # The names of subprocess.CompletedProcess, for assertions written against those.
    @property
    def returncode(self) -> int:
        return self.code

    @property
    def stdout(self) -> str:
        return self.out

    @property
    def stderr(self) -> str:
        return self.err


def argv(*args: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> list[str]:
    """The command's arguments as strings, with `--root ROOT` first when given."""
    head = [] if root is None else ["--root", os.fspath(root)]
    return [*head, *(os.fspath(a) for a in args)]


def environment(env: Env | None = None) -> dict[str, str]:
    """A child's environment: the test's, the source tree importable, no `JOBSPOOL_ROOT`,
    then `env` (a None value unsets that variable)."""
    out = cli_env()
    for name, value in (env or {}).items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


# ---------------------------------------------------------------- in-process


@contextlib.contextmanager
def _patched_environ(env: Env | None) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.pop("JOBSPOOL_ROOT", None)
    for name, value in (env or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    # Long-running commands configure the root logger for their process; in-process that would
    # outlive the command and write to a closed capture buffer in later tests.
    logger = logging.getLogger()
    handlers, level = list(logger.handlers), logger.level
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)


def run_cli(*args: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
            env: Env | None = None, stdin: str | None = None) -> Result:
    """Run `jobspool ARGS` in this process via `jobspool.cli.main`; capture what it prints.

    An argparse usage error (`SystemExit`) is returned as its exit code like any other exit.
    """
    from jobspool.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    try:
        sys.stdin = io.StringIO(stdin or "")
        with _patched_environ(env), _root_logger_kept(), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                code = main(argv(*args, root=root))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin = old_stdin
    return Result(int(code), out.getvalue(), err.getvalue())


# ---------------------------------------------------------------- as a real process


def command(*args: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
            prefix: Sequence[str] = ()) -> list[str]:
    """The full command line: `prefix` (e.g. an strace invocation), then `python -m jobspool`."""
    return [*prefix, sys.executable, "-m", "jobspool", *argv(*args, root=root)]


def run_jobspool(*args: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                 env: Env | None = None, stdin: str | None = None, timeout: float = 120.0,
                 prefix: Sequence[str] = (), cwd: str | os.PathLike[str] = REPO) -> Result:
    """Run `jobspool ARGS` as a real process to its end; `timeout` only guards against a hang."""
    done = subprocess.run(command(*args, root=root, prefix=prefix), cwd=cwd,
                          env=environment(env), input=(stdin or "").encode(),
                          capture_output=True, timeout=timeout, check=False)
    return Result(done.returncode, done.stdout.decode(errors="replace"),
                  done.stderr.decode(errors="replace"))


def start_jobspool(*args: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                   env: Env | None = None, prefix: Sequence[str] = (),
                   stdin: int | IO[Any] | None = subprocess.DEVNULL,
                   stdout: int | IO[Any] | None = subprocess.PIPE,
                   stderr: int | IO[Any] | None = subprocess.PIPE,
                   cwd: str | os.PathLike[str] = REPO,
                   **popen: Any) -> subprocess.Popen[Any]:
    """Start `jobspool ARGS` as a real process and return at once (bytes pipes, unless `text=True`
    or another Popen option says otherwise)."""
    return subprocess.Popen(command(*args, root=root, prefix=prefix), cwd=cwd,
                            env=environment(env), stdin=stdin, stdout=stdout, stderr=stderr,
                            **popen)


class LineReader:
    """Reads a child's pipe line by line with a deadline, keeping every line it read.

    Reading directly from the pipe (no thread) means whatever the reader consumed is gone from a
    later `communicate()`: use `rest()` to drain the pipe once the process has exited, and
    `text()` for everything read.
    """

    def __init__(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            raise ValueError("LineReader needs a pipe: start the process with stdout/stderr=PIPE")
        self._stream = stream
        self._fd = stream.fileno()
        self._partial = b""
        self.lines: list[str] = []
        self.eof = False
        self._seen = 0  # lines before this index were already matched or passed over

    def _read_some(self, wait: float) -> None:
        # poll, not select: select refuses descriptors past 1023, which a long test session
        # (LanceDB and PostgreSQL clients keep theirs open) reaches.
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP)
        if not poller.poll(max(wait, 0.0) * 1000):
            return
        chunk = os.read(self._fd, 65536)
        if not chunk:
            self.eof = True
            if self._partial:
                self.lines.append(self._partial.decode(errors="replace"))
                self._partial = b""
            return
        self._partial += chunk
        *whole, self._partial = self._partial.split(b"\n")
        self.lines.extend(line.decode(errors="replace") for line in whole)

    def wait_for(self, pattern: str | re.Pattern[str], timeout: float = 60.0, what: str = ""
                 ) -> str:
        """The first line not yet returned that matches `pattern` (a regex, searched); fails the
        test if the pipe closes or `timeout` passes first (a hang guard, not a timing claim)."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            for i in range(self._seen, len(self.lines)):
                if regex.search(self.lines[i]):
                    self._seen = i + 1
                    return self.lines[i]
            self._seen = len(self.lines)
            left = deadline - time.monotonic()
            if self.eof or left <= 0:
                why = "the pipe closed" if self.eof else f"{timeout} s passed"
                tail = "\n".join(self.lines[-40:])
                pytest.fail(f"{why} before a line matching {regex.pattern!r}"
                            f"{f' ({what})' if what else ''}; it printed:\n{tail}")
            self._read_some(min(left, 0.5))

    def rest(self, timeout: float = 60.0) -> str:
        """Read to the end of the pipe (the writer exited), and return what this call read."""
        before = len(self.lines)
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"the pipe stayed open {timeout} s after it should have closed")
            self._read_some(min(left, 0.5))
        return "".join(line + "\n" for line in self.lines[before:])

    def text(self) -> str:
        """Every line read so far."""
        return "".join(line + "\n" for line in self.lines)



def reap(proc: subprocess.Popen[Any]) -> None:
    """Kill a process the test started if it is still running, and collect it: what a test's
    `finally` does, so that a failed wait or assertion leaves no process behind."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()

def one_error_line(result: Result, code: int | None = None) -> str:
    """The single `jobspool: error: ...` line a failing command prints: no traceback, exit
    non-zero (or exactly `code`)."""
    if code is None:
        assert result.code != 0, result
    else:
        assert result.code == code, f"expected exit {code}, got {result.code}: {result.err!r}"
    assert "Traceback" not in result.err, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {result.err!r}"
    assert lines[0].startswith("jobspool: error: "), lines[0]
    return lines[0]


def app_module(tmp_path: os.PathLike[str], name: str, source: str) -> dict[str, str | None]:
    """Write `name.py` into a directory of its own; the environment that makes it importable."""
    d = Path(tmp_path) / "apps"
    d.mkdir(exist_ok=True)
    (d / f"{name}.py").write_text(source)
    return {"PYTHONPATH": os.pathsep.join([str(REPO), str(d)])}
