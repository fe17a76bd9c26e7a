"""Guessing the dashboard's token: wrong tokens from one address are throttled (throttle.py).

Unthrottled, a script could try thousands of tokens a second by the login form or a
bearer header, and an operator's token may be short.
"""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from jobspool import Spool
from jobspool.dashboard import create_app
from jobspool.dashboard.throttle import MAX_FAILURES, Throttle
from tests.spools import SpoolFactory, make_spool  # noqa: F401

LOCAL = "http://127.0.0.1"
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')
TOKEN = "s3cret-token"


@pytest.fixture
def spool(make_spool: SpoolFactory) -> Spool:  # noqa: F811
    return make_spool()


def _client(spool: Spool) -> TestClient:
    return TestClient(create_app(spool, token=TOKEN), base_url=LOCAL,  # type: ignore[arg-type]
                      follow_redirects=False)


def _login(client: TestClient, token: str) -> int:
    found = _CSRF.search(client.get("/login").text)
    assert found, "no CSRF field on /login"
    return client.post("/login", data={"csrf": found.group(1), "token": token,
                                       "next": "/"}).status_code


def test_after_too_many_wrong_tokens_by_the_form_even_the_right_one_waits(spool: Spool) -> None:
    with _client(spool) as client:
        wrong = [_login(client, f"guess-{i}") for i in range(MAX_FAILURES)]
        found = _CSRF.search(client.get("/login").text)
        assert found
        held = client.post("/login", data={"csrf": found.group(1), "token": TOKEN, "next": "/"})
    assert wrong == [401] * MAX_FAILURES
    # The right token does not show while throttled: a guess cannot be confirmed.
    assert held.status_code == 429, held.text
    assert int(held.headers["retry-after"]) >= 1
    assert "too many wrong tokens" in held.text
    assert "set-cookie" not in held.headers or "jobspool_auth" not in held.headers["set-cookie"]


def test_wrong_bearer_headers_are_throttled_and_a_login_cookie_is_not(spool: Spool) -> None:
    app = create_app(spool, token=TOKEN)
    with TestClient(app, base_url=LOCAL, follow_redirects=False) as browser, \
            TestClient(app, base_url=LOCAL, follow_redirects=False) as script:
        assert _login(browser, TOKEN) == 303  # this browser holds the login cookie
        wrong = [script.get("/api/overview", headers={"authorization": f"Bearer g{i}"})
                 .status_code for i in range(MAX_FAILURES)]
        held = script.get("/api/overview", headers={"authorization": f"Bearer {TOKEN}"})
        by_cookie = browser.get("/api/overview")  # same address: no guess, not throttled
    assert wrong == [401] * MAX_FAILURES
    assert held.status_code == 429 and int(held.headers["retry-after"]) >= 1
    assert by_cookie.status_code == 200, by_cookie.text


def test_a_right_token_in_time_clears_the_count(spool: Spool) -> None:
    with _client(spool) as client:
        first = [client.get("/api/overview", headers={"authorization": "Bearer nope"})
                 .status_code for _ in range(MAX_FAILURES - 1)]
        ok = client.get("/api/overview", headers={"authorization": f"Bearer {TOKEN}"})
        again = [client.get("/api/overview", headers={"authorization": "Bearer nope"})
                 .status_code for _ in range(MAX_FAILURES - 1)]
        still = client.get("/api/overview", headers={"authorization": f"Bearer {TOKEN}"})
    assert first == [401] * (MAX_FAILURES - 1) and again == [401] * (MAX_FAILURES - 1)
    assert ok.status_code == 200 and still.status_code == 200


def test_the_window_slides_and_addresses_count_apart() -> None:
    now = [1000.0]
    throttle = Throttle(limit=3, window=60.0, clock=lambda: now[0])
    for _ in range(3):
        throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == pytest.approx(60.0)
    assert throttle.wait("10.0.0.2") == 0.0
    now[0] += 30.0
    assert throttle.wait("10.0.0.1") == pytest.approx(30.0)
    now[0] += 30.0
    assert throttle.wait("10.0.0.1") == 0.0  # the oldest failure left the window
    throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == 0.0  # one failure in the window now


def test_the_served_dashboard_counts_the_peer_not_a_forwarded_for_header(
        spool: Spool) -> None:
    """uvicorn's default took the client's address from `X-Forwarded-For` when the peer was
    loopback (an SSH tunnel, a local script): a guesser named a new address each time and
    was never throttled, or named someone else's to lock it out (a probe)."""
    import urllib.error
    import urllib.request

    from tests.cli_harness import LineReader, reap, start_jobspool
    from tests.waiting import wait_until

    proc = start_jobspool("dashboard", "--token", TOKEN, "--port", "0", "--poll", "0",
                          root=spool.root)
    try:
        line = LineReader(proc.stdout).wait_for(r"http://", 60, what="the dashboard's URL")
        url = next(w for w in line.split() if w.startswith("http://"))
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def status(token: str, forwarded: str | None = None) -> int:
            headers = {"authorization": f"Bearer {token}"}
            if forwarded is not None:
                headers["x-forwarded-for"] = forwarded
            request = urllib.request.Request(url + "api/overview", headers=headers)
            try:
                with direct.open(request, timeout=10) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                exc.close()
                return int(exc.code)

        wait_until(lambda: status(TOKEN) == 200, 60, "the dashboard to serve")
        wrong = [status(f"g{i}", forwarded=f"203.0.113.{i}") for i in range(MAX_FAILURES)]
        held = status(TOKEN, forwarded="198.51.100.1")
    finally:
        proc.terminate()
        reap(proc)
    assert wrong == [401] * MAX_FAILURES
    assert held == 429  # the peer (127.0.0.1) made every guess, whatever the header said
