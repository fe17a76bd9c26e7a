"""The operator's commands, run as an operator runs them: `python -m jobspool` in a subprocess.

`health` exits 0 / 2 for cron jobs and container healthchecks, `stats
--prometheus` is what node_exporter's textfile collector reads, `worker
--metrics-port` serves it live, and bad input is one line and exit 1.
"""

from __future__ import annotations

import os
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cli_harness import one_error_line, reap, run_jobspool, start_jobspool
from tests.spools import make_spool
from tests.subproc import REPO
from tests.waiting import wait_until

APP = """
def noop(job, ctx):
    return None

handlers = {"mail": noop}
"""


def app_env(app_dir: Path) -> dict[str, str | None]:
    """The source tree and the test's app directory importable."""
    return {"PYTHONPATH": os.pathsep.join([str(REPO), str(app_dir)])}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    make_spool(path).close()
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
    proc = run_jobspool("health", root=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")
    proc = run_jobspool("health", "--json", root=root)
    assert proc.returncode == 0
    assert orjson.loads(proc.stdout)["status"] == "ok"

    with make_spool(root) as spool:
        spool.enqueue("mail", job_id="m1")
        (lease,) = spool.claim()
        spool.fail(lease, "mailbox gone", retryable=False)

    proc = run_jobspool("health", root=root)
    assert proc.returncode == 2
    assert proc.stdout.startswith("degraded") and "[dead_letters]" in proc.stdout
    proc = run_jobspool("health", "--json", root=root)
    assert proc.returncode == 2
    doc = orjson.loads(proc.stdout)
    assert doc["status"] == "degraded"
    assert [r["code"] for r in doc["reasons"]] == ["dead_letters"]

    with make_spool(root) as spool:
        spool.requeue("m1")
    assert run_jobspool("health", root=root).returncode == 0


@pytest.mark.parametrize("bound", ["0", "-5", "soon", "inf"])
def test_health_refuses_a_bound_that_is_not_a_positive_number(root: Path, bound: str) -> None:
    proc = run_jobspool("health", "--max-due-age", bound, root=root)
    assert proc.returncode == 1
    assert "--max-due-age" in one_error_line(proc)


def test_stats_prometheus_prints_the_text_exposition(root: Path) -> None:
    with make_spool(root) as spool:
        spool.enqueue_many("mail", range(3))
        spool.claim(kinds="mail")
    proc = run_jobspool("stats", "--prometheus", root=root)
    assert proc.returncode == 0, proc.stderr
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(proc.stdout) for s in f.samples}
    assert samples[("jobspool_jobs", (("kind", "mail"), ("state", "ready")))] == 2
    assert samples[("jobspool_jobs", (("kind", "mail"), ("state", "leased")))] == 1
    assert samples[("jobspool_fence", ())] == 1
    assert samples[("jobspool_dead_letters", ())] == 0


def test_log_level_that_does_not_exist_is_one_line_and_exit_1(root: Path, app_dir: Path) -> None:
    for command in ("worker", "run-until-idle"):
        proc = run_jobspool(command, "--app", "opsapp:handlers", "--log-level", "nope",
                                     env=app_env(app_dir), root=root)
        assert proc.returncode == 1
        assert "--log-level" in one_error_line(proc)
    proc = run_jobspool("worker", "--app", "opsapp:handlers", "--log-format", "xml",
                        env=app_env(app_dir), root=root)
    assert proc.returncode == 1
    assert "--log-format" in one_error_line(proc)


def test_worker_metrics_port_in_use_is_one_line_and_exit_1(root: Path, app_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = run_jobspool("worker", "--app", "opsapp:handlers", "--no-maintenance",
                            "--metrics-port", str(port), env=app_env(app_dir), root=root)
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert f"--metrics-port {port}" in line


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_worker_metrics_port_that_is_not_a_port_is_exit_1(root: Path, app_dir: Path,
                                                          port: str) -> None:
    proc = run_jobspool("worker", "--app", "opsapp:handlers", "--metrics-port", port,
                        env=app_env(app_dir), root=root)
    assert proc.returncode == 1
    one_error_line(proc)


def test_worker_serves_metrics_on_loopback_and_stops_on_sigterm(root: Path, app_dir: Path) -> None:
    with make_spool(root) as spool:
        spool.enqueue_many("mail", range(5))
    port = free_port()
    proc = start_jobspool("worker", "--app", "opsapp:handlers", "--no-maintenance",
                          "--metrics-port", str(port), "--grace", "5", root=root,
                          env=app_env(app_dir), text=True)

    def metrics_showing_the_work() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                candidate: str = r.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return None  # not serving yet
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(candidate) for s in f.samples}
        done = samples.get(("jobspool_jobs", (("kind", "mail"), ("state", "completed"))))
        return candidate if done == 5 else None

    try:
        body = wait_until(metrics_showing_the_work, 30,
                          "the worker to serve metrics showing its work", proc=proc)
        assert body is not None
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        reap(proc)
    assert proc.returncode == 0, err
    assert "worker stopped" in out


def test_a_handlers_terminal_escapes_are_shown_escaped_in_text_log_lines(
        root: Path, tmp_path: Path) -> None:
    # Found in a CLI probe: a handler's error holding ESC sequences reached the terminal raw
    # in the text log line (retitling it, recoloring what followed); `list` escapes it.
    app_dir = tmp_path / "escapp"
    app_dir.mkdir()
    (app_dir / "escapp.py").write_text(
        "from jobspool import Fail\n"
        "def bad(job, ctx):\n"
        "    raise Fail('bad \\x1b]0;PWNED\\x07 \\x1b[31mred\\x1b[0m')\n"
        "handlers = {'esc': bad}\n")
    assert run_jobspool("enqueue", "esc", "{}", root=root).code == 0
    done = run_jobspool("run-until-idle", "--app", "escapp:handlers", root=root,
                        env=app_env(app_dir))
    assert done.code == 0, done.err
    assert "\x1b" not in done.err and "\x07" not in done.err
    assert "bad \\x1b]0;PWNED\\x07 \\x1b[31mred" in done.err, done.err


def test_worker_metrics_port_0_says_which_port_it_took(root: Path, app_dir: Path) -> None:
    """It served on a free port and never said which (an HTTP probe)."""
    import re
    import select

    proc = start_jobspool("worker", "--app", "opsapp:handlers", "--no-maintenance",
                          "--metrics-port", "0", "--grace", "5", root=root,
                          env=app_env(app_dir), text=True)
    try:
        assert proc.stderr is not None
        poller = select.poll()
        poller.register(proc.stderr.fileno(), select.POLLIN | select.POLLHUP)
        assert poller.poll(30_000), "the worker said nothing within 30 s"
        line = proc.stderr.readline()
        found = re.search(r"serving metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
        assert found, line
        with urllib.request.urlopen(found.group(1), timeout=10) as r:
            assert r.status == 200 and b"# TYPE jobspool_due_jobs gauge" in r.read()
    finally:
        reap(proc)
