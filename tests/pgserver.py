"""A real PostgreSQL server for the PostgreSQL store's tests (issue 16), as pytest fixtures.

`pg_server` (session): the server named by `JOBSPOOL_TEST_PG_URL` when set, else a throwaway
cluster started by `tools/pg-tmp.sh` (as the `postgres` user when we are root) and stopped at
the end of the session. A server that cannot start fails the tests that need it with the
script's stderr: the PostgreSQL tests are never skipped.

`pg_url` (function): a fresh schema `t_<hex>` on that server and the server's URL with
`?options=-csearch_path%3Dt_<hex>`, so every unqualified table the store creates lands in that
schema and tests cannot see each other's jobs. The schema is dropped at teardown.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
PG_TMP = REPO / "tools" / "pg-tmp.sh"


def _script(*args: str) -> str:
    """Run tools/pg-tmp.sh; a failure fails the calling test with the script's stderr."""
    proc = subprocess.run([str(PG_TMP), *args], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        pytest.fail(
            f"tools/pg-tmp.sh {' '.join(args)} exited {proc.returncode}:\n{proc.stderr.strip()}",
            pytrace=False,
        )
    return proc.stdout


def with_search_path(url: str, schema: str) -> str:
    """`url` with `options=-csearch_path=<schema>` added to its query (kept percent-encoded)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


@dataclass
class PgServer:
    """A running server: `url` to connect, `dir` its pg-tmp.sh directory (None when external)."""

    url: str
    dir: Path | None

    def _need_dir(self, what: str) -> Path:
        if self.dir is None:
            pytest.fail(
                f"{what} needs a server this session started (unset JOBSPOOL_TEST_PG_URL)", pytrace=False
            )
        return self.dir

    def restart(self) -> None:
        """`pg_ctl restart -m fast` on the same port: every open connection is dropped."""
        _script("restart", str(self._need_dir("restart()")))

    def kill(self) -> None:
        """Stop with `-m immediate` (a crash: no checkpoint, crash recovery on the next start)."""
        _script("kill", str(self._need_dir("kill()")))

    def start_again(self) -> None:
        """Start a killed server again on its old port."""
        _script("start-again", str(self._need_dir("start_again()")))

    def kill_and_start(self) -> None:
        """A server crash and its return, same port, same data."""
        self.kill()
        self.start_again()

    def stop(self) -> None:
        if self.dir is not None:
            _script("stop", str(self.dir))


def _start() -> PgServer:
    out = _script("start")
    env: dict[str, str] = {}
    for line in out.splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            for word in words[1:]:
                key, _, value = word.partition("=")
                env[key] = value
    if "DATABASE_URL" not in env or "PGTMP_DIR" not in env:
        pytest.fail(f"tools/pg-tmp.sh start printed no DATABASE_URL/PGTMP_DIR:\n{out}", pytrace=False)
    return PgServer(url=env["DATABASE_URL"], dir=Path(env["PGTMP_DIR"]))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The PostgreSQL server of this test session (see the module docstring)."""
    external = os.environ.get("JOBSPOOL_TEST_PG_URL")
    if external:
        yield PgServer(url=external, dir=None)
        return
    server = _start()
    try:
        yield server
    finally:
        server.stop()


def new_schema(url: str) -> tuple[str, str]:
    """Create a fresh schema `t_<hex>` on the server at `url`: (its name, a URL that uses it)."""
    import psycopg
    from psycopg import sql

    schema = f"t_{uuid.uuid4().hex}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return schema, with_search_path(url, schema)


def drop_schema(url: str, schema: str) -> None:
    """Drop a schema made by `new_schema` with everything in it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        stmt = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        try:
            conn.execute(stmt)
        except psycopg.errors.LockNotAvailable:
            # A leaked connection (a process a test killed that the server has not reaped yet,
            # a pool not closed) holds a lock on the schema: end the other sessions, then drop.
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
            conn.execute(stmt)


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema of its own (dropped at teardown)."""
    schema, url = new_schema(pg_server.url)
    yield url
    drop_schema(pg_server.url, schema)
