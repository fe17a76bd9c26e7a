"""A throwaway PostgreSQL server for bench/pg.py (never for tests: they have their own).

Uses the project's `tools/pg-tmp.sh` when the checkout carries one; otherwise the same
recipe as ../shared/tools/pg-tmp.sh done here: initdb into a temporary directory and
pg_ctl start on a free port, as the `postgres` user through runuser when we are root
(the server refuses to run as root). fsync and synchronous_commit stay on: the figures
are those of a durable server.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "pg-tmp.sh"


@dataclass(frozen=True)
class Server:
    """A running server: its base URL (database `postgres`) and how to stop it."""

    url: str
    directory: str
    via_script: bool

    def database_url(self, name: str) -> str:
        """The URL of database `name` on this server."""
        return self.url.rsplit("/", 1)[0] + "/" + name


def _pgbin() -> str:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)])
    if not found:
        raise SystemExit("bench/pg.py: error: no PostgreSQL binaries under /usr/lib/postgresql "
                         "(apt-get install -y postgresql), or pass --url")
    return str(os.environ.get("PGBIN") or found[-1])


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(options: str = "") -> Server:
    """Start a fresh server; `options` are extra `-c name=value` flags for the postmaster."""
    if SCRIPT.exists():
        env = dict(os.environ, PGTMP_OPTS=options)
        out = subprocess.run(["bash", str(SCRIPT), "start"], check=True, capture_output=True,
                             text=True, env=env).stdout
        found = dict(re.findall(r"(\w+)=(\S+)", out))
        return Server(found["DATABASE_URL"], found["PGTMP_DIR"], True)
    pgbin = _pgbin()
    d = tempfile.mkdtemp(prefix="pgbench.")
    os.chmod(d, 0o755)  # the postgres user must reach it; the sockets live here
    if os.geteuid() == 0:
        shutil.chown(d, "postgres", "postgres")
    port = _free_port()
    log = Path(d) / "initdb.log"
    with log.open("w") as f:
        # -N: skip initdb's own fsyncs (throwaway cluster); the server itself still fsyncs
        rc = subprocess.run(_as_postgres([f"{pgbin}/initdb", "-D", f"{d}/data", "-U", "postgres",
                                          "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8", "-N"]),
                            stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        raise SystemExit(f"bench/pg.py: error: initdb failed:\n{log.read_text()}")
    post = f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c max_connections=200 {options}"
    rc = subprocess.run(_as_postgres([f"{pgbin}/pg_ctl", "-D", f"{d}/data", "-l", f"{d}/server.log",
                                      "-w", "-t", "60", "-o", post, "start"]),
                        stdout=subprocess.DEVNULL).returncode
    if rc:
        raise SystemExit(f"bench/pg.py: error: pg_ctl start failed:\n"
                         f"{(Path(d) / 'server.log').read_text()}")
    return Server(f"postgresql://postgres@127.0.0.1:{port}/postgres", d, False)


def stop(server: Server) -> None:
    """Stop the server at once and remove its directory."""
    if server.via_script:
        subprocess.run(["bash", str(SCRIPT), "stop", server.directory], check=False)
        return
    subprocess.run(_as_postgres([f"{_pgbin()}/pg_ctl", "-D", f"{server.directory}/data",
                                 "-m", "immediate", "-w", "stop"]),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    shutil.rmtree(server.directory, ignore_errors=True)
