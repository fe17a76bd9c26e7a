"""Audit of issue 13: the dashboard is a long-running command like `worker`, so it takes
`--log-format json|text` and `--log-level`, and with JSON logs every stderr line is one
JSON object: its start-up line, the web server's own warnings, and a refusal."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson

from tests.cli_harness import LineReader, run_jobspool, start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until

HANG_GUARD = 30.0  # seconds: only reached when something is broken


def _json_lines(text: str) -> list[dict[str, Any]]:
    docs = [orjson.loads(line) for line in text.splitlines()]  # each line must be JSON
    assert all(isinstance(d, dict) for d in docs)
    return docs


def test_the_dashboard_with_json_logs_writes_only_json_lines_including_server_warnings(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    proc = start_jobspool("dashboard", "--port", "0", "--poll", "0", "--log-format", "json",
                          "--log-level", "info", root=root)
    try:
        line = LineReader(proc.stdout).wait_for(r"^", HANG_GUARD, "the dashboard's first line")
        url = next((w for w in line.split() if w.startswith("http://")), None)
        assert url is not None, line
        port = int(url.rstrip("/").rsplit(":", 1)[1])

        def connect() -> socket.socket | None:
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=5)
            except ConnectionError:
                return None

        # readiness: the server accepts connections
        conn = wait_until(connect, HANG_GUARD, "the dashboard to accept connections", proc=proc)
        with conn:
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")  # the server warns about it
            conn.settimeout(HANG_GUARD)
            while conn.recv(4096):
                pass
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=HANG_GUARD)
    docs = _json_lines(err.decode())
    assert docs[0]["event"] == "start" and docs[0]["command"] == "dashboard"
    # With --port 0 the start event names the port asked for; the next one the port taken.
    listening = [d for d in docs if d.get("event") == "listening"]
    assert [(d["port"], d["url"]) for d in listening] == [(port, url)]
    assert any("invalid http request" in d["msg"].lower() and d["level"] == "warning"
               for d in docs), docs


def test_a_refused_dashboard_with_json_logs_writes_its_error_as_one_json_line(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    done = run_jobspool("dashboard", "--host", "0.0.0.0", "--log-format", "json", root=root,
                        env={"JOBSPOOL_DASHBOARD_TOKEN": ""}, timeout=60)
    assert done.returncode == 2
    (doc,) = _json_lines(done.stderr)
    assert doc["level"] == "error" and doc["exit"] == 2 and "0.0.0.0" in doc["msg"]
