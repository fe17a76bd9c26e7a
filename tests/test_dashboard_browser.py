"""The dashboard in a real headless Chromium (Debian's, driven by Selenium and chromedriver).

Each test starts `jobspool dashboard` in its own OS process on a port the
OS picks (`--port 0`; the command prints its URL once the socket listens),
then waits until it answers. The browser is started once per module with a
fresh profile and the flags that work in a container.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from jobspool.queue.states import JobState
from tests.cli_harness import LineReader, run_jobspool, start_jobspool
from tests.spools import make_spool
from tests.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HANG_GUARD = 30.0  # seconds: only ever reached when something is broken
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


class Server:
    """A `jobspool dashboard` process and its URL."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str) -> None:
        self.proc = proc
        self.url = url.rstrip("/")

    def stop(self) -> str:
        """Stop it (SIGTERM: uvicorn shuts down cleanly) and return what it wrote to stderr."""
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err.decode(errors="replace")


def start_dashboard(root: Path, *extra: str) -> Server:
    """Start the dashboard on a free port and return once it answers HTTP."""
    proc = start_jobspool("dashboard", "--port", "0", "--poll", "0.2", *extra, root=root)
    try:
        line = LineReader(proc.stdout).wait_for("http://", HANG_GUARD, "the dashboard's URL")
    except BaseException:
        Server(proc, "").stop()
        raise
    url = next(w for w in line.split() if w.startswith("http://"))
    server = Server(proc, url)

    def answers() -> bool:
        try:
            with _DIRECT.open(server.url + "/static/favicon.svg", timeout=5) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    try:
        wait_until(answers, HANG_GUARD, "the dashboard to answer HTTP", proc=proc)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Under pytest's temp root, so the profile is cleaned up with the run's other files.
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                 "--no-proxy-server",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(HANG_GUARD)
    yield driver
    driver.quit()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def served(root: Path, browser: webdriver.Chrome) -> Iterator[Server]:
    make_spool(root).close()
    server = start_dashboard(root)
    yield server
    browser.delete_all_cookies()
    server.stop()


def _dead(root: Path, kind: str, n: int, error: str = "boom") -> list[str]:
    with make_spool(root) as spool:
        ids = [spool.enqueue(kind, {"n": i}).id for i in range(n)]
        for lease in spool.claim(kinds=[kind], limit=n):
            spool.fail(lease, error, retryable=False)
    return ids


def _state(root: Path, job_id: str) -> JobState:
    with make_spool(root) as spool:
        return spool.get(job_id).state


def _stats_json(root: Path) -> dict[str, Any]:
    done = run_jobspool("stats", "--json", root=root, timeout=60)
    assert done.code == 0, done.err
    doc = orjson.loads(done.out)
    assert isinstance(doc, dict)
    return doc


def _wait(browser: webdriver.Chrome, what: Any) -> Any:
    return WebDriverWait(browser, HANG_GUARD).until(what)


def _no_alert(browser: webdriver.Chrome) -> bool:
    try:
        browser.switch_to.alert  # noqa: B018 - the property raises when there is none
    except NoAlertPresentException:
        return True
    return False


def test_the_overview_shows_the_counts_of_stats_json(root: Path, served: Server,
                                                     browser: webdriver.Chrome) -> None:
    _dead(root, "mail", 2)
    with make_spool(root) as spool:
        spool.enqueue("thumb", {})
        spool.enqueue("thumb", {}, delay=600)
        spool.cancel(spool.enqueue("mail", {}).id)
    stats = _stats_json(root)
    browser.get(served.url + "/")
    cells = browser.find_elements(By.CSS_SELECTOR, "#state-counts td[data-count]")
    shown = {c.get_attribute("data-count"): int(c.text) for c in cells}
    assert shown == stats["counts"]
    assert browser.find_element(By.CSS_SELECTOR, "[data-field=total]").text == str(stats["total"])
    assert browser.find_element(By.ID, "health-status").text == "degraded"
    # one script call: the poll rebuilds these rows, so element handles could go stale
    kinds = browser.execute_script(
        "return Array.from(document.querySelectorAll('#kind-counts tbody th'))"
        ".map(function (e) { return e.textContent; })")
    assert kinds == ["mail", "thumb"]


def test_counts_update_without_a_reload(root: Path, served: Server,
                                        browser: webdriver.Chrome) -> None:
    browser.get(served.url + "/")
    browser.execute_script("document.body.setAttribute('data-marker', 'same page')")
    badge = browser.find_element(By.CSS_SELECTOR, "nav [data-count=ready]")
    assert badge.text == "0"
    with make_spool(root) as spool:
        spool.enqueue_many("mail", [{}, {}, {}])
    _wait(browser, lambda b: b.find_element(By.CSS_SELECTOR, "nav [data-count=ready]").text
          == "3")
    # the same document, updated in place: a reload would have dropped the marker
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-marker") == "same page"


def test_requeue_from_the_dead_letter_page_moves_the_job(root: Path, served: Server,
                                                         browser: webdriver.Chrome) -> None:
    first, second = _dead(root, "mail", 2)
    browser.get(served.url + "/jobs/dead_letter")
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{second}"]')
    row.find_element(By.CSS_SELECTOR, "button[data-action=requeue]").click()
    _wait(browser, lambda b: b.find_elements(By.ID, "notice"))
    assert browser.find_element(By.ID, "notice").text == f"requeued {second}"
    # back on the list it came from, which no longer holds the job
    assert browser.current_url == served.url + "/jobs/dead_letter"
    assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{second}"]') == []
    assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{first}"]') != []
    assert _state(root, second) is JobState.READY
    assert _state(root, first) is JobState.DEAD_LETTER


def test_bulk_requeue_of_a_kind_goes_through_a_confirmation(root: Path, served: Server,
                                                            browser: webdriver.Chrome) -> None:
    mail = _dead(root, "mail", 2)
    (thumb,) = _dead(root, "thumb", 1)
    browser.get(served.url + "/jobs/dead_letter?kind=mail")
    browser.find_element(By.CSS_SELECTOR, "button[data-action=bulk-requeue]").click()
    confirm = _wait(browser, lambda b: b.find_elements(By.ID, "confirm"))[0]
    assert "Requeue 2 dead letters of kind" in browser.find_element(By.TAG_NAME, "h1").text
    assert [_state(root, i) for i in mail] == [JobState.DEAD_LETTER] * 2
    confirm.click()
    _wait(browser, lambda b: b.find_elements(By.ID, "notice"))
    assert [_state(root, i) for i in mail] == [JobState.READY] * 2
    assert _state(root, thumb) is JobState.DEAD_LETTER


def test_a_script_payload_is_inert_text(root: Path, served: Server,
                                        browser: webdriver.Chrome) -> None:
    attack = "<script>window.__pwned = 1; alert('xss')</script>"
    with make_spool(root) as spool:
        job = spool.enqueue("mail", {"to": attack})
        (lease,) = spool.claim()
        spool.fail(lease, "<img src=x onerror=\"window.__pwned = 2; alert('xss')\">",
                   retryable=False)
    for path in (f"/job/{job.id}", "/jobs/dead_letter", "/"):
        browser.get(served.url + path)
        assert _no_alert(browser)
        assert browser.execute_script("return window.__pwned === undefined")
    browser.get(served.url + f"/job/{job.id}")
    assert attack in browser.find_element(By.ID, "payload").text
    assert "<img src=x" in browser.find_element(By.ID, "error").text
    assert browser.find_elements(By.CSS_SELECTOR, "main script, main img") == []


def test_an_action_without_the_csrf_token_is_refused(root: Path, served: Server,
                                                     browser: webdriver.Chrome) -> None:
    (job_id,) = _dead(root, "mail", 1)
    browser.get(served.url + f"/job/{job_id}")
    browser.execute_script(
        "document.querySelectorAll('input[name=csrf]').forEach(function (e) { e.remove(); })")
    browser.find_element(By.CSS_SELECTOR, "button[data-action=requeue]").click()
    message = _wait(browser, lambda b: b.find_elements(By.ID, "error-message"))[0]
    assert "CSRF" in message.text
    assert _state(root, job_id) is JobState.DEAD_LETTER


def test_read_only_has_no_action_buttons(root: Path, browser: webdriver.Chrome) -> None:
    (job_id,) = _dead(root, "mail", 1)
    server = start_dashboard(root, "--read-only")
    try:
        for path in ("/", "/jobs/dead_letter", f"/job/{job_id}", "/quarantine"):
            browser.get(server.url + path)
            assert browser.find_elements(By.CSS_SELECTOR, "form[method=post], [data-action]") == []
            labels = {b.text for b in browser.find_elements(By.TAG_NAME, "button")}
            assert labels <= {"Filter"}  # the list's filter form (a GET) is all that is left
        assert browser.find_element(By.ID, "read-only-badge").text == "read-only"
    finally:
        browser.delete_all_cookies()
        server.stop()
    assert _state(root, job_id) is JobState.DEAD_LETTER


def test_with_a_token_the_login_form_lets_the_browser_in(root: Path,
                                                         browser: webdriver.Chrome) -> None:
    make_spool(root).close()
    env_token = "correct-horse-battery"
    server = start_dashboard(root, "--token", env_token)
    try:
        browser.get(server.url + "/jobs/ready")
        field = browser.find_element(By.NAME, "token")
        field.send_keys("wrong")
        field.submit()
        assert _wait(browser, lambda b: b.find_elements(By.ID, "login-error"))[0].text == \
            "wrong token"
        field = browser.find_element(By.NAME, "token")
        field.send_keys(env_token)
        field.submit()
        _wait(browser, lambda b: b.current_url.endswith("/jobs/ready"))
        assert browser.find_element(By.TAG_NAME, "h1").text.startswith("ready")
    finally:
        browser.delete_all_cookies()
        server.stop()


@pytest.fixture(autouse=True)
def _no_ambient_token() -> Iterator[None]:
    saved = os.environ.pop("JOBSPOOL_DASHBOARD_TOKEN", None)
    yield
    if saved is not None:
        os.environ["JOBSPOOL_DASHBOARD_TOKEN"] = saved


def test_a_scheduled_jobs_pill_keeps_saying_scheduled_after_a_poll(
        root: Path, served: Server, browser: webdriver.Chrome) -> None:
    # The page rendered "scheduled"; the first poll wrote the job's state ("retryable") over
    # it, though the API sends the status too.
    with make_spool(root) as spool:
        job = spool.enqueue("thumb", {}, delay=600)
    browser.get(served.url + f"/job/{job.id}")
    pill = browser.find_element(By.CSS_SELECTOR, "[data-job=state]")
    assert pill.text == "scheduled"
    _wait(browser, lambda b: int(b.find_element(By.TAG_NAME, "body")
                                 .get_attribute("data-polls") or "0") >= 3)
    assert browser.find_element(By.CSS_SELECTOR, "[data-job=state]").text == "scheduled"
