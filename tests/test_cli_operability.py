"""The operator's commands, run as an operator runs them: `python -m jobspool` in a subprocess.

`health` exits 0 / 2 for cron jobs and container healthchecks, `stats
--prometheus` is what node_exporter's textfile collector reads, `worker
--metrics-port` serves it live, and bad input is one line and exit 1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobspool import Spool

MAIN = Path(__file__).resolve().parent.parent
APP = """
def noop(job, ctx):
    return None

handlers = {"mail": noop}
"""


def env(extra_path: Path | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(str(p) for p in (MAIN, extra_path) if p is not None)
    e.pop("JOBSPOOL_ROOT", None)
    return e


def run(root: Path, *args: str, app_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobspool", "--root", str(root), *args],
                          capture_output=True, text=True, env=env(app_dir), timeout=60)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {proc.stderr!r}"
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("jobspool: error:")
    return lines[0]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    Spool(path, durable=False).close()
    return path


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "opsapp.py").write_text(APP)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_health_exits_0_when_ok_and_2_with_reasons_when_degraded(root: Path) -> None:
    proc = run(root, "health")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")
    proc = run(root, "health", "--json")
    assert proc.returncode == 0
    assert orjson.loads(proc.stdout)["status"] == "ok"

    with Spool(root, durable=False) as spool:
        spool.enqueue("mail", job_id="m1")
        (lease,) = spool.claim()
        spool.fail(lease, "mailbox gone", retryable=False)

    proc = run(root, "health")
    assert proc.returncode == 2
    assert proc.stdout.startswith("degraded") and "[dead_letters]" in proc.stdout
    proc = run(root, "health", "--json")
    assert proc.returncode == 2
    doc = orjson.loads(proc.stdout)
    assert doc["status"] == "degraded"
    assert [r["code"] for r in doc["reasons"]] == ["dead_letters"]

    with Spool(root, durable=False) as spool:
        spool.requeue("m1")
    assert run(root, "health").returncode == 0


@pytest.mark.parametrize("bound", ["0", "-5", "soon", "inf"])
def test_health_refuses_a_bound_that_is_not_a_positive_number(root: Path, bound: str) -> None:
    proc = run(root, "health", "--max-due-age", bound)
    assert proc.returncode == 1
    assert "--max-due-age" in one_line_error(proc)


def test_stats_prometheus_prints_the_text_exposition(root: Path) -> None:
    with Spool(root, durable=False) as spool:
        spool.enqueue_many("mail", range(3))
        spool.claim(kinds="mail")
    proc = run(root, "stats", "--prometheus")
    assert proc.returncode == 0, proc.stderr
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(proc.stdout) for s in f.samples}
    assert samples[("jobspool_jobs", (("kind", "mail"), ("state", "ready")))] == 2
    assert samples[("jobspool_jobs", (("kind", "mail"), ("state", "leased")))] == 1
    assert samples[("jobspool_fence", ())] == 1
    assert samples[("jobspool_dead_letters", ())] == 0


def test_log_level_that_does_not_exist_is_one_line_and_exit_1(root: Path, app_dir: Path) -> None:
    for command in ("worker", "run-until-idle"):
        proc = run(root, command, "--app", "opsapp:handlers", "--log-level", "nope",
                   app_dir=app_dir)
        assert proc.returncode == 1
        assert "--log-level" in one_line_error(proc)
    proc = run(root, "worker", "--app", "opsapp:handlers", "--log-format", "xml",
               app_dir=app_dir)
    assert proc.returncode == 1
    assert "--log-format" in one_line_error(proc)


def test_worker_metrics_port_in_use_is_one_line_and_exit_1(root: Path, app_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = run(root, "worker", "--app", "opsapp:handlers", "--no-maintenance",
                   "--metrics-port", str(port), app_dir=app_dir)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert f"--metrics-port {port}" in line


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_worker_metrics_port_that_is_not_a_port_is_exit_1(root: Path, app_dir: Path,
                                                          port: str) -> None:
    proc = run(root, "worker", "--app", "opsapp:handlers", "--metrics-port", port,
               app_dir=app_dir)
    assert proc.returncode == 1
    one_line_error(proc)


def test_worker_serves_metrics_on_loopback_and_stops_on_sigterm(root: Path, app_dir: Path) -> None:
    with Spool(root, durable=False) as spool:
        spool.enqueue_many("mail", range(5))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobspool", "--root", str(root), "worker", "--app",
         "opsapp:handlers", "--no-maintenance", "--metrics-port", str(port), "--grace", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(app_dir))
    try:
        deadline = time.monotonic() + 30  # guards against a hang only
        body = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    candidate = r.read().decode()
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.05)
                continue
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for f in text_string_to_metric_families(candidate) for s in f.samples}
            if samples.get(("jobspool_jobs", (("kind", "mail"), ("state", "completed")))) == 5:
                body = candidate
                break
            time.sleep(0.05)
        assert body is not None, "the worker never served metrics showing its work"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "worker stopped" in out
