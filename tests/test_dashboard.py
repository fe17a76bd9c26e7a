"""The dashboard app in-process (Starlette's test client): security, actions, pages, paging.

The browser tests (test_dashboard_browser.py) cover the same promises as a
user meets them; these pin the HTTP contract down case by case.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from jobspool import RunReport, Spool
from jobspool.dashboard import create_app
from jobspool.dashboard.data import page
from jobspool.dashboard.throughput import Throughput, chart
from jobspool.queue.states import JobState
from tests.cli_harness import LineReader, run_cli, run_jobspool, start_jobspool
from tests.spools import SpoolFactory, make_spool
from tests.waiting import wait_until

LOCAL = "http://127.0.0.1"
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@pytest.fixture
def spool(make_spool: SpoolFactory) -> Spool:
    """A scratch spool on the real clock (the dashboard shows ages)."""
    return make_spool()


def _dead(spool: Spool, kind: str, n: int, error: str = "boom") -> list[str]:
    ids = [spool.enqueue(kind, {"n": i}).id for i in range(n)]
    for lease in spool.claim(kinds=[kind], limit=n):
        spool.fail(lease, error, retryable=False)
    return ids


def _client(spool: Spool, **options: object) -> TestClient:
    return TestClient(create_app(spool, **options), base_url=LOCAL,  # type: ignore[arg-type]
                      follow_redirects=False)


def _csrf(client: TestClient, path: str = "/jobs/dead_letter") -> str:
    found = _CSRF.search(client.get(path).text)
    assert found, f"no CSRF field on {path}"
    return found.group(1)


def test_overview_json_has_the_counts_of_stats(spool: Spool) -> None:
    _dead(spool, "mail", 2)
    spool.enqueue("thumb", {})
    with _client(spool) as client:
        doc = client.get("/api/overview").json()
    assert doc["counts"] == spool.stats().counts
    assert doc["by_kind"]["mail"]["dead_letter"] == 2
    assert doc["by_kind"]["thumb"]["ready"] == 1
    assert doc["health"]["status"] == "degraded"
    assert "dead_letters" in [r["code"] for r in doc["health"]["reasons"]]


def test_a_worker_snapshot_with_counters_that_are_not_counts_does_not_break_the_overview(
        spool: Spool) -> None:
    # `"completed": 1e30` (or an integer past 64 bits, which orjson reads as a float) went
    # into the throughput buckets: every /api/overview was a 500 for the next hour.
    from jobspool.metrics import publish_worker_report, read_worker_reports

    publish_worker_report(spool, "w1", RunReport(completed=2))
    with _client(spool) as client:
        assert client.get("/api/overview").status_code == 200
        path = spool.root / "metrics" / "w1.json"
        doc = orjson.loads(path.read_bytes())
        path.write_bytes(orjson.dumps({**doc, "completed": 1e30, "claimed": -5,
                                       # each one a count, their sum past 64 bits
                                       "dead_lettered": 2**63 - 1}).replace(
            b'"retried":0', b'"retried":' + str(2**63 - 1).encode()))
        assert read_worker_reports(spool)["w1"]["completed"] == 0
        for _ in range(2):  # the sample that takes the bad file in, and the next one
            answer = client.get("/api/overview")
            assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("stray", ["zzbad.json", "zz has space.json", "zz-<b>.json"])
def test_one_unreadable_file_does_not_hide_the_readable_jobs_of_its_state(
        spool: Spool, stray: str) -> None:
    # Found in a CLI probe: the whole ready list answered 503 for one damaged file, where
    # `jobspool list` skips it with a warning; then (an HTTP probe) for a file whose name
    # is no job id, restored by hand.
    ids = [spool.enqueue("ok", {"i": i}).id for i in range(3)]
    (spool.root / "ready" / stray).write_text("{oops")
    client = _client(spool)
    got = client.get("/api/jobs/ready")
    assert got.status_code == 200, got.text
    assert [j["id"] for j in got.json()["jobs"]] == ids
    html = client.get("/jobs/ready")
    assert html.status_code == 200 and all(i in html.text for i in ids)


def test_the_json_says_a_delayed_job_is_scheduled_not_a_failing_retry(spool: Spool) -> None:
    # Found in an operations probe: `list --json` and `show` told them apart, the
    # dashboard's JSON did not.
    later = spool.enqueue("k", {}, delay=600)
    client = _client(spool)
    (listed,) = client.get("/api/jobs/retryable").json()["jobs"]
    assert listed["id"] == later.id and listed["status"] == "scheduled"
    assert client.get(f"/api/job/{later.id}").json()["status"] == "scheduled"


def test_the_overview_does_not_call_a_delayed_job_that_came_due_later(
        tmp_path: Path) -> None:
    # Found in a time probe: "Due now 2 ... 1 scheduled later" for a delayed job already
    # due and counted in "Due now" too (`stats` words it "scheduled (delayed, not run yet)").
    spool = make_spool(tmp_path / "s")  # on the real clock, as the dashboard's reads are
    spool.enqueue("k", {})
    later = spool.enqueue("k", {}, delay=0.2)
    while time.time() <= later.run_at:
        time.sleep(0.05)
    client = _client(spool)
    doc = client.get("/api/overview").json()
    assert (doc["due"], doc["scheduled"]) == (2, 1)
    text = client.get("/").text
    assert "scheduled later" not in text and "scheduled (delayed, not run yet)" in text


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(spool: Spool) -> None:
    (job_id,) = _dead(spool, "mail", 1)
    with _client(spool) as client:
        client.get("/")  # a session cookie, as a browser would have
        refused = client.post(f"/job/{job_id}/requeue", data={})
        wrong = client.post(f"/job/{job_id}/requeue", data={"csrf": "0" * 64})
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert wrong.status_code == 403
    assert spool.get(job_id).state is JobState.DEAD_LETTER


def test_non_ascii_csrf_fields_and_auth_cookies_are_refused_not_a_server_error(
        spool: Spool) -> None:
    """Found by an operator probe: `compare_digest` on two `str` raises for non-ASCII, and
    `csrf=%C3%A9` (or a cookie of one accented letter) got a 500 and a logged traceback."""
    (job_id,) = _dead(spool, "mail", 1)
    with _client(spool) as client:
        client.get("/")
        csrf = client.post(f"/job/{job_id}/requeue", data={"csrf": "\u00e9"})
    with _client(spool, token="s3cret-token") as client:
        cookie = client.get("/api/overview",
                            headers={"cookie": "jobspool_auth=\u00e9".encode("latin-1")})
    assert csrf.status_code == 403
    assert cookie.status_code == 401
    assert spool.get(job_id).state is JobState.DEAD_LETTER


def test_a_csrf_token_from_another_session_is_refused(spool: Spool) -> None:
    (job_id,) = _dead(spool, "mail", 1)
    app = create_app(spool)
    with TestClient(app, base_url=LOCAL) as alice, TestClient(app, base_url=LOCAL) as mallory:
        token = _csrf(mallory)
        alice.get("/")
        response = alice.post(f"/job/{job_id}/requeue", data={"csrf": token},
                              follow_redirects=False)
    assert response.status_code == 403
    assert spool.get(job_id).state is JobState.DEAD_LETTER


def test_requeue_and_cancel_by_post_move_the_job_and_redirect_with_a_notice(spool: Spool) -> None:
    (dead,) = _dead(spool, "mail", 1)
    live = spool.enqueue("mail", {}).id
    with _client(spool) as client:
        token = _csrf(client)
        r1 = client.post(f"/job/{dead}/requeue", data={"csrf": token})
        shown = client.get(r1.headers["location"]).text
        shown_again = client.get(r1.headers["location"]).text
        r2 = client.post(f"/job/{live}/cancel", data={"csrf": token})
    assert r1.status_code == 303 and r1.headers["location"] == f"/job/{dead}"
    assert r2.status_code == 303
    assert spool.get(dead).state is JobState.READY
    assert spool.get(live).state is JobState.CANCELED
    assert f"requeued {dead}" in shown
    assert f"requeued {dead}" not in shown_again  # a notice is shown once


def test_no_action_is_reachable_by_get(spool: Spool) -> None:
    (job_id,) = _dead(spool, "mail", 1)
    with _client(spool) as client:
        codes = [client.get(p).status_code for p in
                 (f"/job/{job_id}/requeue", f"/job/{job_id}/cancel", "/dead/requeue?kind=mail",
                  "/dead/purge?kind=mail")]
    assert codes == [405, 405, 405, 405]
    assert spool.get(job_id).state is JobState.DEAD_LETTER


def test_a_cross_origin_post_is_refused_even_with_a_token(spool: Spool) -> None:
    (job_id,) = _dead(spool, "mail", 1)
    with _client(spool) as client:
        token = _csrf(client)
        response = client.post(f"/job/{job_id}/requeue", data={"csrf": token},
                               headers={"origin": "https://evil.example"})
    assert response.status_code == 403
    assert spool.get(job_id).state is JobState.DEAD_LETTER


def test_bulk_requeue_asks_for_confirmation_then_moves_only_that_kind(spool: Spool) -> None:
    mail = _dead(spool, "mail", 3)
    other = _dead(spool, "thumb", 1)
    with _client(spool) as client:
        token = _csrf(client, "/jobs/dead_letter")
        ask = client.post("/dead/requeue", data={"csrf": token, "kind": "mail"})
        untouched = [spool.get(i).state for i in mail]
        done = client.post("/dead/requeue", data={"csrf": token, "kind": "mail",
                                                  "confirm": "yes", "until": _until(ask.text)})
    assert ask.status_code == 200 and "Requeue 3 dead letters of kind" in ask.text
    assert untouched == [JobState.DEAD_LETTER] * 3
    assert done.status_code == 303
    assert [spool.get(i).state for i in mail] == [JobState.READY] * 3
    assert spool.get(other[0]).state is JobState.DEAD_LETTER


def test_bulk_purge_removes_the_dead_letters_of_a_kind_for_good(spool: Spool) -> None:
    mail = _dead(spool, "mail", 2)
    other = _dead(spool, "thumb", 1)
    with _client(spool) as client:
        token = _csrf(client, "/jobs/dead_letter")
        ask = client.post("/dead/purge", data={"csrf": token, "kind": "mail"})
        client.post("/dead/purge", data={"csrf": token, "kind": "mail", "confirm": "yes",
                                         "until": _until(ask.text)})
    assert [j.id for j in spool.jobs()] == other
    assert not any((spool.root / s.value / f"{i}.json").exists() for s in JobState for i in mail)


@pytest.mark.parametrize("verb", ["requeue", "purge"])
def test_a_bulk_confirmation_acts_only_on_the_dead_letters_it_listed(
        spool: Spool, verb: str) -> None:
    """Found by an operator probe: the page listed two dead letters and said "Yes, purge 2";
    a third that died meanwhile was purged too (the form named only the kind). One that
    dies after the listing is left alone; a confirmation with no listing is refused."""
    listed = _dead(spool, "mail", 2)
    with _client(spool) as client:
        token = _csrf(client, "/jobs/dead_letter")
        ask = client.post(f"/dead/{verb}", data={"csrf": token, "kind": "mail"})
        time.sleep(0.01)  # a later death: its updated_at past the listing's newest
        (later,) = _dead(spool, "mail", 1)
        bare = client.post(f"/dead/{verb}", data={"csrf": token, "kind": "mail",
                                                  "confirm": "yes"})
        forged = client.post(f"/dead/{verb}", data={"csrf": token, "kind": "mail",
                                                    "confirm": "yes", "until": "-1"})
        still = spool.get(later).state
        done = client.post(f"/dead/{verb}", data={"csrf": token, "kind": "mail",
                                                  "confirm": "yes", "until": _until(ask.text)})
    assert "Yes, " + verb + " 2" in ask.text
    for refused in (bare, forged):  # a negative bound was a 503 (requeue), "purged 0"
        assert refused.status_code == 303 and "confirm%20again" in refused.headers["set-cookie"]
    assert still is JobState.DEAD_LETTER
    assert done.status_code == 303
    assert spool.get(later).state is JobState.DEAD_LETTER
    if verb == "purge":
        assert [j.id for j in spool.jobs()] == [later]
    else:
        assert {i: spool.get(i).state for i in listed} == {i: JobState.READY for i in listed}


def _until(page: str) -> str:
    found = re.search(r'name="until" value="([^"]*)"', page)
    assert found, "the confirmation page carries its listing's bound"
    return found.group(1)


def test_read_only_hides_every_action_and_refuses_posts(spool: Spool) -> None:
    (job_id,) = _dead(spool, "mail", 1)
    with _client(spool, read_only=True) as client:
        pages = [client.get(p).text for p in ("/", "/jobs/dead_letter", f"/job/{job_id}",
                                              "/quarantine")]
        token = _CSRF.search(client.get("/").text)
        refused = client.post(f"/job/{job_id}/requeue", data={"csrf": "x"})
    assert not any('method="post"' in p for p in pages)
    assert token is None  # no forms, so no token either
    assert refused.status_code == 403 and "read-only" in refused.text
    assert spool.get(job_id).state is JobState.DEAD_LETTER


def test_the_login_redirect_keeps_the_query_of_a_shared_link(spool: Spool) -> None:
    """It kept the path only: a filtered link landed on the unfiltered list (HTTP probe)."""
    with _client(spool, token="s3cret-token") as client:
        first = client.get("/jobs/dead_letter?kind=mail&q=boom")
        token = _csrf(client, "/login")
        back = first.headers["location"].split("next=", 1)[1]
        from urllib.parse import unquote
        login = client.post("/login", data={"csrf": token, "token": "s3cret-token",
                                            "next": unquote(back)})
    assert first.status_code == 303
    assert login.status_code == 303
    assert login.headers["location"] == "/jobs/dead_letter?kind=mail&q=boom"


def test_a_non_ascii_token_works_as_a_bearer_header_sent_as_utf8(spool: Spool) -> None:
    """Headers are decoded as latin-1: curl's UTF-8 bytes of 'tökén' never matched, so
    scripts were locked out with a token a person could log in with (an HTTP probe)."""
    with _client(spool, token="tökén") as client:
        sent = "Bearer tökén".encode().decode("latin-1")  # what the server sees from curl
        ok = client.get("/api/overview", headers=[(b"authorization", sent.encode("latin-1"))])
        wrong = client.get("/api/overview", headers={"authorization": "Bearer token"})
    assert ok.status_code == 200, ok.text
    assert wrong.status_code == 401


def test_with_a_token_every_request_needs_it_by_header_or_login_cookie(spool: Spool) -> None:
    with _client(spool, token="s3cret-token") as client:
        page_redirect = client.get("/")
        api = client.get("/api/overview")
        bearer = client.get("/api/overview", headers={"authorization": "Bearer s3cret-token"})
        wrong = client.get("/api/overview", headers={"authorization": "Bearer nope"})
        token = _csrf(client, "/login")
        bad_login = client.post("/login", data={"csrf": token, "token": "nope", "next": "/"})
        login = client.post("/login", data={"csrf": token, "token": "s3cret-token",
                                            "next": "/jobs/ready"})
        after = client.get("/api/overview")
    assert page_redirect.status_code == 303 and page_redirect.headers["location"].startswith(
        "/login")
    assert api.status_code == 401 and wrong.status_code == 401
    assert bearer.status_code == 200
    assert bad_login.status_code == 401
    assert login.status_code == 303 and login.headers["location"] == "/jobs/ready"
    assert "s3cret-token" not in login.headers["set-cookie"]
    assert after.status_code == 200


def test_login_never_redirects_off_site(spool: Spool) -> None:
    with _client(spool, token="t") as client:
        token = _csrf(client, "/login")
        response = client.post("/login", data={"csrf": token, "token": "t",
                                               "next": "//evil.example/x"})
    assert response.headers["location"] == "/"


def test_without_a_token_only_loopback_host_headers_are_answered(spool: Spool) -> None:
    with _client(spool) as client:
        rebound = client.get("/", headers={"host": "attacker.example"})
        local = client.get("/", headers={"host": "localhost:8177"})
    assert rebound.status_code == 400
    assert local.status_code == 200


def test_markup_in_payloads_and_errors_is_escaped(spool: Spool) -> None:
    job = spool.enqueue("mail", {"to": "<script>alert(1)</script>"})
    (lease,) = spool.claim()
    spool.fail(lease, "<img src=x onerror=alert(2)>", retryable=False)
    with _client(spool) as client:
        shown = client.get(f"/job/{job.id}")
        listed = client.get("/jobs/dead_letter")
    for response in (shown, listed):
        assert "<img src=x" not in response.text
        assert "&lt;img src=x onerror=alert(2)&gt;" in response.text
        assert "script-src 'self'" in response.headers["content-security-policy"]
    assert "<script>alert(1)" not in shown.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown.text


def test_the_job_page_shows_payload_result_error_lease_and_traceback(spool: Spool) -> None:
    job = spool.enqueue("mail", {"to": "ann"})
    (lease,) = spool.claim(owner="worker-7")
    with _client(spool) as client:
        running = client.get(f"/job/{job.id}").text
        spool.complete(lease, {"sent": True})
        done = client.get(f"/job/{job.id}").text
        api = client.get(f"/api/job/{job.id}").json()
        missing = client.get("/job/no-such-job")
    assert "worker-7" in running and "Cancel" in running
    assert "&#34;sent&#34;: true" in done and "completed" in done
    assert api["state"] == "completed" and "traceback" in api
    assert missing.status_code == 404


def test_pages_follow_the_cursor_and_filters_without_reading_earlier_files(spool: Spool) -> None:
    ids = [spool.enqueue("a" if i % 2 else "b", {"i": i}, job_id=f"job-{i:03d}").id
           for i in range(30)]
    first = page(spool, JobState.READY, size=10)
    second = page(spool, JobState.READY, size=10, cursor=first.next_cursor)
    kind_a = page(spool, JobState.READY, kind="a", size=5, cursor="job-020")
    assert [j.id for j in first.jobs] == ids[:10] and first.scanned == 10
    assert [j.id for j in second.jobs] == ids[10:20] and second.scanned == 10
    assert [j.id for j in kind_a.jobs] == ["job-021", "job-023", "job-025", "job-027",
                                           "job-029"]
    assert kind_a.scanned == 9 and kind_a.next_cursor is None
    assert first.total == 30


def test_terminal_lists_page_newest_first_and_text_matches_errors(spool: Spool) -> None:
    for i in range(6):
        spool.enqueue("mail", {}, job_id=f"d-{i}")
    for lease in spool.claim(limit=6):
        spool.fail(lease, "timeout" if lease.job_id in ("d-1", "d-4") else "refused",
                   retryable=False)
    newest = page(spool, JobState.DEAD_LETTER, size=4)
    rest = page(spool, JobState.DEAD_LETTER, size=4, cursor=newest.next_cursor)
    timeouts = page(spool, JobState.DEAD_LETTER, text="TimeOut")
    assert [j.id for j in newest.jobs] == ["d-5", "d-4", "d-3", "d-2"]
    assert [j.id for j in rest.jobs] == ["d-1", "d-0"] and rest.next_cursor is None
    assert [j.id for j in timeouts.jobs] == ["d-4", "d-1"]


def test_the_list_page_links_to_the_next_page_with_its_filters(spool: Spool) -> None:
    for i in range(60):
        spool.enqueue("mail", {}, job_id=f"job-{i:03d}")
    with _client(spool) as client:
        first = client.get("/jobs/ready?kind=mail").text
        nxt = re.search(r'id="next-page" href="([^"]+)"|href="([^"]+)" id="next-page"', first)
        assert nxt
        second = client.get((nxt.group(1) or nxt.group(2)).replace("&amp;", "&")).text
        bad = client.get("/jobs/ready?kind=../x")
    row = 'data-job-id="{}"'.format
    assert row("job-049") in first and row("job-050") not in first
    assert row("job-050") in second and row("job-049") not in second
    assert bad.status_code == 400


def test_throughput_counts_what_published_counters_grew_by(spool: Spool) -> None:
    from jobspool.metrics import publish_worker_report
    from jobspool.queue.report import RunReport

    now = [1_800_000_030.0]
    tp = Throughput(spool, clock=lambda: now[0])
    publish_worker_report(spool, "w1", RunReport(completed=5, retried=1))
    tp.sample()  # baseline: w1 was already running
    publish_worker_report(spool, "w1", RunReport(completed=12, retried=1, dead_lettered=2))
    publish_worker_report(spool, "w2", RunReport(completed=3))
    now[0] += 60
    tp.sample()
    series = tp.series()
    assert series["totals"] == {"completed": 10, "failed": 2}
    assert series["rows"][-1]["completed"] == 10
    assert len(series["rows"]) == 60
    assert series["chart"]["max"] == 20


def test_throughput_counts_runs_too_short_to_publish_and_each_runs_last_seconds(
        spool: Spool) -> None:
    """A worker removed its snapshot at exit: a `run-until-idle` shorter than the 5 s between
    snapshots was never counted (the chart said 0 next to 2,000 completions), nor the last
    seconds of any run."""
    from jobspool import Worker
    from jobspool.metrics import publish_worker_report
    from jobspool.queue.report import RunReport

    tp = Throughput(spool)
    tp.sample()  # the dashboard's first look: nothing running
    spool.enqueue_many("k", range(20))
    report = Worker(spool, handlers={"k": lambda job, ctx: None}).run_until_idle()
    assert report.completed == 20
    tp.sample()
    assert tp.series()["totals"]["completed"] == 20
    tp.sample()  # counted once
    assert tp.series()["totals"]["completed"] == 20
    # A long run seen at 7 completed, exiting at 10: its last 3 count.
    publish_worker_report(spool, "long", RunReport(completed=7))
    tp.sample()
    publish_worker_report(spool, "long", RunReport(completed=10), final=True)
    tp.sample()
    assert tp.series()["totals"]["completed"] == 20 + 7 + 3
    assert [n for n in os.listdir(spool.root / "metrics") if n.endswith(".json")] == []


def test_throughput_counts_each_run_of_one_worker_and_not_a_run_older_than_it(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One `Worker` run three times has one owner: only its first final was counted; and a
    final of a run begun before the dashboard counted jobs its backfill had read too
    (a regression probe)."""
    from jobspool import Worker, metrics
    from jobspool.queue.report import RunReport

    tp = Throughput(spool)
    tp.sample()
    worker = Worker(spool, handlers={"k": lambda job, ctx: None})
    for n in (1, 2, 3):
        spool.enqueue_many("k", range(5))
        assert worker.run_until_idle().completed == 5
        tp.sample()
        assert tp.series()["totals"]["completed"] == 5 * n
    older = RunReport(completed=8, duration=3600.0)  # begun an hour before the dashboard
    metrics.publish_worker_report(spool, "old-run", older, final=True)
    tp.sample()
    assert tp.series()["totals"]["completed"] == 15


def test_a_worker_that_cannot_write_its_final_counters_leaves_no_live_snapshot(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk at exit left the live snapshot behind: health called the worker stuck."""
    from jobspool import metrics
    from jobspool.queue.report import RunReport

    metrics.publish_worker_report(spool, "w", RunReport(completed=1))
    real_open = os.open

    def full(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".tmp") and ".final." in str(path):
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(metrics.os, "open", full)
    with pytest.raises(OSError):
        metrics.publish_worker_report(spool, "w", RunReport(completed=2), final=True)
    monkeypatch.undo()
    assert metrics.read_worker_reports(spool) == {}


def test_the_chart_stacks_failed_on_completed_within_its_height() -> None:
    rows = [{"minute": 60 * i, "completed": c, "failed": f}
            for i, (c, f) in enumerate([(0, 0), (3, 1), (1, 0)])]
    geometry = chart(rows, width=300, height=100)
    bars = geometry["bars"]
    assert geometry["max"] == 5
    assert [b["series"] for b in bars] == ["completed", "failed", "completed"]
    assert bars[0]["h"] == 60.0 and bars[1]["y"] == 100 - 60 - 20
    assert all(b["y"] >= 0 and b["y"] + b["h"] <= 100.0001 for b in bars)


def test_a_non_loopback_host_without_a_token_is_refused_in_one_line(tmp_path: Path) -> None:
    make_spool(tmp_path / "spool").close()
    done = run_jobspool("dashboard", "--host", "0.0.0.0", "--port", "0", root=tmp_path / "spool",
                        env={"JOBSPOOL_DASHBOARD_TOKEN": None}, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobspool: error: refusing to serve")
    assert "'0.0.0.0'" in lines[0] and "--token" in lines[0]


def test_a_host_that_does_not_resolve_is_bad_input_in_one_line(tmp_path: Path) -> None:
    """It exited 2 with the resolver's code as "Unknown error -2"."""
    make_spool(tmp_path / "spool").close()
    done = run_jobspool("dashboard", "--host", "not a host", "--token", "abc", "--port", "0",
                        root=tmp_path / "spool", timeout=60)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "'not a host'" in lines[0] and "Unknown error" not in lines[0]


def test_the_api_lists_a_page_as_json(spool: Spool) -> None:
    _dead(spool, "mail", 3)
    with _client(spool) as client:
        doc = orjson.loads(client.get("/api/jobs/dead_letter?kind=mail").content)
        unknown = client.get("/api/jobs/nowhere")
    assert doc["total"] == 3 and len(doc["jobs"]) == 3 and doc["next"] is None
    assert unknown.status_code == 404


def test_a_repaired_quarantined_file_is_restored_by_post(spool: Spool) -> None:
    job = spool.enqueue("mail", {"to": "ann"})
    path = spool.root / "ready" / f"{job.id}.json"
    good = path.read_bytes()
    path.write_bytes(b"{not json")
    spool.recover()
    (name,) = [n for n in (spool.root / "quarantine").iterdir() if not n.name.endswith(".reason")]
    name.write_bytes(good)  # the operator repaired it in place
    with _client(spool) as client:
        listing = client.get("/quarantine").text
        token = _csrf(client, "/quarantine")
        done = client.post(f"/quarantine/{name.name}/restore", data={"csrf": token})
        again = client.post(f"/quarantine/{name.name}/restore", data={"csrf": token})
        notice = client.get("/quarantine").text
    assert name.name in listing and "Restore" in listing
    assert done.status_code == 303
    assert spool.get(job.id).state is JobState.READY
    assert again.status_code == 303 and "no quarantined file named" in notice


def test_a_file_name_that_is_not_utf8_is_shown_escaped_not_a_server_error(spool: Spool) -> None:
    """Found by an operator probe: `ready/bad\\xffname.json` (read back with a lone
    surrogate) made `/` and `/api/overview` answer 500 exactly when health had it to
    report, and `/quarantine` once recover had moved it there."""
    import os

    job = spool.enqueue("mail", {})
    good = (spool.root / "ready" / f"{job.id}.json").read_bytes()
    with open(os.fsencode(spool.root / "ready") + b"/bad\xffname.json", "wb") as f:
        f.write(good)
    with _client(spool) as client:
        before = [client.get(path) for path in ("/", "/api/overview")]
        spool.recover()
        after = [client.get(path) for path in ("/quarantine", "/", "/api/overview")]
    assert [r.status_code for r in before + after] == [200] * 5
    assert "bad\\xffname" in before[0].text
    assert "bad\\\\xffname" in before[1].text  # JSON escapes the backslash
    quarantine = after[0].text
    assert "bad\\xffname.json" in quarantine and "Restore" not in quarantine


def test_demo_with_dashboard_leaves_it_running_on_the_demo_spool(tmp_path: Path) -> None:
    import urllib.request

    root = tmp_path / "spool"
    proc = start_jobspool("demo", "--jobs", "40", "--workers", "1", "--dashboard",
                          "--dashboard-port", "0", root=root)
    try:
        # A hang guard only: the demo runs a worker process before it serves.
        line = LineReader(proc.stdout).wait_for("^jobspool dashboard for", 240,
                                                "the demo to start its dashboard")
        url = next(w for w in line.split() if w.startswith("http://"))
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy
        with direct.open(url + "api/overview", timeout=30) as response:
            doc = orjson.loads(response.read())
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert doc["root"] == str(root)
    assert doc["counts"]["completed"] == 39 and doc["counts"]["dead_letter"] == 1


def test_the_job_page_shows_the_traceback_a_worker_recorded(spool: Spool) -> None:
    from jobspool import Worker

    def explode_on_purpose(job: object, ctx: object) -> None:
        raise RuntimeError("disk <full>")

    job = spool.enqueue("mail", {}, max_attempts=1)
    Worker(spool, handlers={"mail": explode_on_purpose}).run_until_idle()
    assert spool.get(job.id).traceback  # the worker recorded one
    with _client(spool) as client:
        shown = client.get(f"/job/{job.id}").text
    section = shown.split('id="traceback"', 1)[1]
    assert "explode_on_purpose" in section and "disk &lt;full&gt;" in section


def test_a_read_only_dashboard_serves_a_user_who_may_only_read_the_spool() -> None:
    """The spool is root's; the dashboard runs as `nobody` (or, without root, on a spool
    nobody may write), shows everything, refuses actions and changes nothing on disk."""
    import os
    import selectors
    import shutil
    import signal
    import stat
    import tempfile
    import urllib.error
    import urllib.request

    base = Path(tempfile.mkdtemp(prefix="jobspool-dash-ro-"))
    os.chmod(base, 0o755)  # outside pytest's private temp tree, so another user can reach it
    root = base / "spool"
    as_root = os.geteuid() == 0
    try:
        with make_spool(root) as spool:
            (dead,) = _dead(spool, "report", 1)
            spool.enqueue("email", {"to": "a@example.com"})
            # The owner walks every page first: each module a request needs is loaded
            # before the forked reader drops its rights.
            with _client(spool, read_only=True) as client:
                for path in ("/", "/api/overview", "/jobs/dead_letter", f"/job/{dead}",
                             "/quarantine", "/static/dashboard.js"):
                    assert client.get(path).status_code == 200, path
                assert client.post(f"/job/{dead}/requeue").status_code == 403
        for dirpath, _dirs, files in os.walk(root):  # others may read; nobody may write
            for p in [dirpath, *(os.path.join(dirpath, f) for f in files)]:
                mode = stat.S_IMODE(os.lstat(p).st_mode) | (0o555 if p == dirpath else 0o444)
                os.chmod(p, mode if as_root else mode & ~0o222)
        before = {p: (os.lstat(p).st_ino, os.lstat(p).st_mtime_ns)
                  for p in map(str, root.rglob("*"))}
        pid, out_fd, err_path = _fork_dashboard_as_reader(
            ["--root", str(root), "dashboard", "--read-only", "--port", "0", "--poll", "0"],
            base / "child.err")
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(out_fd, selectors.EVENT_READ)
                line = os.read(out_fd, 4096).decode() if sel.select(timeout=60) else ""
            url = next((w for w in line.split() if w.startswith("http://")), None)
            assert url is not None, (line, err_path.read_text())
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

            def overview() -> Any:
                try:
                    with direct.open(url + "api/overview", timeout=10) as response:
                        return orjson.loads(response.read())
                except (urllib.error.URLError, ConnectionError):
                    return None  # not serving yet

            doc = wait_until(overview, 60, f"the dashboard to serve ({err_path})")
            with direct.open(url + f"job/{dead}", timeout=10) as response:
                job_page = response.read().decode()
            try:
                direct.open(url + f"job/{dead}/requeue", data=b"csrf=x", timeout=10)
                refused = 200
            except urllib.error.HTTPError as exc:
                refused = exc.code
                exc.close()
        finally:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
            os.close(out_fd)
        err = err_path.read_text()
        assert (doc["counts"]["dead_letter"], doc["counts"]["ready"]) == (1, 1), err
        assert "boom" in job_page and 'method="post"' not in job_page
        assert refused == 403
        assert "Traceback" not in err, err
        after = {p: (os.lstat(p).st_ino, os.lstat(p).st_mtime_ns)
                 for p in map(str, root.rglob("*"))}
        assert after == before  # a read-only dashboard changes nothing on disk
    finally:
        for dirpath, dirs, _files in os.walk(base):
            for d in dirs:
                os.chmod(os.path.join(dirpath, d), 0o755)
        shutil.rmtree(base)


def _fork_dashboard_as_reader(argv: list[str], err_path: Path) -> tuple[int, int, Path]:
    """Run the CLI in a forked child that cannot write the spool (root drops to `nobody`);
    returns its pid, the read end of its stdout, and the file its stderr goes to.

    Forked rather than exec'd: the interpreter's own files may be out of nobody's reach,
    so every module the server needs is loaded here first and inherited.
    """
    import os
    import pwd

    import uvicorn

    from jobspool.cli import build_parser, main

    build_parser()  # imports every command's module (the checkout may be out of nobody's reach)
    warm = uvicorn.Config(create_app.__module__ and "jobspool.dashboard.app:create_app",
                          lifespan="on", log_level="warning")
    warm.load()  # imports the protocol, lifespan and loop modules the server will use
    if hasattr(warm, "get_loop_factory"):
        warm.get_loop_factory()  # newer uvicorn imports its event-loop module only here
    import anyio._backends._asyncio  # noqa: F401 - what the app's threads and tasks run on
    import uvicorn.lifespan.on
    import uvicorn.loops.asyncio
    import uvicorn.loops.auto
    import uvicorn.protocols.http.h11_impl

    err_path.write_text("")
    os.chmod(err_path, 0o666)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 99
        try:
            os.close(read_fd)
            sys.stderr = open(err_path, "w", buffering=1)  # noqa: SIM115 - until _exit
            sys.stdout = os.fdopen(write_fd, "w", buffering=1)
            if os.geteuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
            code = main(argv)
        except BaseException as exc:  # report, do not hang the parent
            import traceback

            sys.stderr.write("child raised " + "".join(traceback.format_exception(exc)))
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd, err_path


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LOCALHOST", True), ("0.0.0.0", False), ("::", False),
    ("10.1.2.3", False), ("example.com", False), ("localhost.example.com", False)])
def test_only_loopback_addresses_count_as_local(host: str, loopback: bool) -> None:
    from jobspool.dashboard.security import BindRefused, check_bind, is_loopback

    assert is_loopback(host) is loopback
    if loopback:
        check_bind(host, None)
    else:
        with pytest.raises(BindRefused, match="without a token"):
            check_bind(host, None)
        check_bind(host, "a-token")  # a token makes any address acceptable


@pytest.mark.parametrize("token", [" ", "a\nb", "tab\there", " padded", "padded "])
def test_a_token_no_client_could_send_is_refused_before_serving(token: str) -> None:
    # Found by a CLI fuzz: `--token $'a\nb'` (or " ") was taken, and no header or login
    # form could ever carry it.
    from jobspool.dashboard.security import BindRefused, check_bind

    for host in ("127.0.0.1", "0.0.0.0"):
        with pytest.raises(BindRefused, match="must be printable"):
            check_bind(host, token)
    check_bind("0.0.0.0", "s3cret-\u00e9t\u00e9")  # printable non-ASCII is fine
    r = run_cli("dashboard", "--token", token, root="/nonexistent-spool")
    assert r.code == 2 and "must be printable" in r.err
    assert len(r.err.strip().splitlines()) == 1


def test_an_empty_token_option_is_refused_not_taken_for_none(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    # Found by a CLI fuzz: `--token "$TOKEN"` with TOKEN unset served on loopback with no
    # token at all, saying nothing, and would have used the environment's instead.
    monkeypatch.setenv("JOBSPOOL_DASHBOARD_TOKEN", "from-the-env")
    for args in (["dashboard", "--token", ""], ["demo", "--dashboard", "--dashboard-token", ""]):
        r = run_cli(*args, root="/nonexistent-spool")
        assert r.code == 1 and f"{args[-2]} is empty" in r.err, r
        assert len(r.err.strip().splitlines()) == 1


def test_the_origin_check_accepts_only_this_server() -> None:
    from jobspool.dashboard.security import same_origin

    assert same_origin(None, "127.0.0.1:8177")  # no header: not a cross-site browser post
    assert same_origin("http://127.0.0.1:8177", "127.0.0.1:8177")
    assert not same_origin("http://127.0.0.1:9999", "127.0.0.1:8177")
    assert not same_origin("https://evil.example", "127.0.0.1:8177")
    assert not same_origin("null", "127.0.0.1:8177")


def test_a_busy_port_is_refused_in_one_line(tmp_path: Path) -> None:
    import socket

    make_spool(tmp_path / "spool").close()
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = run_jobspool("dashboard", "--port", str(port), root=tmp_path / "spool",
                            timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"jobspool: error: cannot listen on 127.0.0.1:{port}: " \
                          f"Address already in use\n"


def test_the_job_page_shows_a_delayed_job_as_scheduled_not_as_a_failed_retry(
        spool: Spool) -> None:
    delayed = spool.enqueue("mail", {"to": "ann"}, delay=3600)
    with _client(spool) as client:
        shown = client.get(f"/job/{delayed.id}").text
    pill = shown.split('data-job="state">', 1)[1].split("<", 1)[0]
    assert pill == "scheduled"
    assert "kept in retryable/" in shown


def test_a_spool_deleted_under_the_dashboard_gives_one_line_503s_then_recovers(
        tmp_path: Path) -> None:
    # Found in the robustness pass: every page but the cached overview answered a bare
    # "500 Internal Server Error", and after the first a lock with closed descriptors
    # failed every later request, even once the spool was made again at its path.
    import shutil

    root = tmp_path / "spool"
    with make_spool(root) as spool, _client(spool) as client:
        spool.enqueue("k", {}, job_id="a")
        shutil.rmtree(root)
        for path in ("/jobs/ready", "/job/a", "/api/job/a", "/api/jobs/ready"):
            r = client.get(path)
            assert r.status_code == 503, (path, r.status_code)
            text = r.json()["error"] if path.startswith("/api/") else r.text
            assert f"{root}: the spool directory is missing" in text, (path, text)
        make_spool(root).close()  # an operator makes it again (`jobspool init`)
        assert client.get("/jobs/ready").status_code == 200
        assert client.get("/api/job/a").status_code == 404
        spool.enqueue("k", {}, job_id="b")
        assert client.get("/api/job/b").json()["state"] == "ready"


def _serving(proc: Any) -> str:
    """Wait until a `jobspool dashboard` process answers; its URL."""
    import urllib.request

    line = LineReader(proc.stdout).wait_for("http://", 120, "the dashboard's URL")
    url = next(w for w in line.split() if w.startswith("http://"))
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def answers() -> bool:
        try:
            with direct.open(url + "api/overview", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_until(answers, 60, "the dashboard to serve")
    return str(url)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_dashboard_stopped_by_a_signal_exits_0(tmp_path: Path, sig: int) -> None:
    """A normal stop (systemd and docker send SIGTERM) exited 143, a death by signal:
    uvicorn raises the signal again after its shutdown, with the default handler."""
    root = tmp_path / "spool"
    make_spool(root).close()
    proc = start_jobspool("dashboard", "--port", "0", root=root)
    try:
        _serving(proc)  # its signal handling set up
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err


def test_per_kind_counts_are_refreshed_in_the_background_not_in_a_request(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by a scale probe: on a 325,000-job file spool each request that came due for
    # the per-kind refresh waited its whole pass (12-14 s), the cache locked for the others.
    from jobspool.dashboard import data

    monkeypatch.setattr(data, "_KIND_MIN_INTERVAL", 0.0)  # due again at once
    monkeypatch.setattr(data, "_KIND_COST_FACTOR", 0.0)
    spool.enqueue("mail", {})
    overview = data.Overview(spool)
    assert overview.by_kind() == {"mail": {"ready": 1}}  # a quick first pass: waited for
    spool.enqueue("thumb", {})
    real_stats = spool.stats
    passing, release = threading.Event(), threading.Event()

    def slow_stats(*, by_kind: bool = False) -> Any:
        if by_kind:
            passing.set()
            release.wait(60)  # a long pass over every job file
        return real_stats(by_kind=by_kind)

    monkeypatch.setattr(spool, "stats", slow_stats)
    assert overview.by_kind() == {"mail": {"ready": 1}}  # stale at once: the pass runs aside
    assert passing.wait(60)
    assert overview.by_kind() == {"mail": {"ready": 1}}  # still not waiting for it
    release.set()
    wait_until(lambda: "thumb" in overview.by_kind(), 60, "the background pass to land")
    assert overview.by_kind()["thumb"] == {"ready": 1}


def test_the_first_page_does_not_wait_for_a_long_first_count_per_kind(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by a scale check: the first overview of a 200,000-job file spool took 23 s, its
    # first per-kind pass (every job file read) run inside the request.
    from jobspool.dashboard import data

    monkeypatch.setattr(data, "_KIND_FIRST_WAIT", 0.05)
    spool.enqueue("mail", {})
    real_stats = spool.stats
    release = threading.Event()

    def slow_stats(*, by_kind: bool = False) -> Any:
        if by_kind:
            release.wait(60)  # a long pass over every job file
        return real_stats(by_kind=by_kind)

    monkeypatch.setattr(spool, "stats", slow_stats)
    try:
        with _client(spool) as client:
            page = client.get("/")
            assert page.status_code == 200
            assert "counting jobs per kind" in page.text and "no jobs" not in page.text
            doc = client.get("/api/overview").json()
            assert doc["by_kind_pending"] is True and doc["by_kind"] == {}
            assert doc["counts"]["ready"] == 1  # everything else is there at once
            release.set()
            wait_until(lambda: not client.get("/api/overview").json()["by_kind_pending"], 60,
                       "the first per-kind pass to land")
            doc = client.get("/api/overview").json()
            assert doc["by_kind"]["mail"]["ready"] == 1
            assert "counting jobs per kind" not in client.get("/").text
    finally:
        release.set()


def test_a_quick_first_count_per_kind_is_on_the_first_page(spool: Spool) -> None:
    spool.enqueue("mail", {})
    with _client(spool) as client:
        doc = client.get("/api/overview").json()
    assert doc["by_kind_pending"] is False
    assert doc["by_kind"]["mail"]["ready"] == 1


def test_a_request_still_open_at_a_stop_is_one_line_not_tracebacks(tmp_path: Path) -> None:
    """A client that sent half a form when SIGTERM came: uvicorn cancels it after the grace
    and logged three chained tracebacks (57 lines) for it. One line says it now."""
    import socket

    root = tmp_path / "spool"
    make_spool(root).close()
    proc = start_jobspool("dashboard", "--port", "0", root=root)
    client = None
    try:
        url = _serving(proc)
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"POST /job/x/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                       b"application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ncsrf=")
        time.sleep(0.5)  # the request is in the app, waiting for the rest of its body
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if client is not None:
            client.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "Traceback" not in text and len(text.strip().splitlines()) <= 1, text


def test_the_jobs_api_lists_a_payload_as_deep_as_enqueue_takes(spool: Spool) -> None:
    # 253 levels are accepted; a listing put each job two levels deeper than orjson writes,
    # and /api/jobs/ready was a 500 for the whole page.
    from jobspool.queue.job import MAX_JSON_DEPTH

    deep: Any = 0
    for _ in range(MAX_JSON_DEPTH):
        deep = [deep]
    spool.enqueue("deep", deep, job_id="deep")
    spool.enqueue("plain", {}, job_id="plain")
    with _client(spool) as client:
        answer = client.get("/api/jobs/ready")
    assert answer.status_code == 200, answer.text
    assert sorted(j["id"] for j in answer.json()["jobs"]) == ["deep", "plain"]


def test_an_action_while_another_process_holds_the_lock_is_refused_with_nothing_done(
        spool: Spool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in a dashboard probe: an action waited for the lock as long as another process
    held it; stopping the server then answered 500, and the action was carried out anyway
    once the lock came free."""
    from jobspool.dashboard import actions
    from tests.lock_holder import holding_lock

    monkeypatch.setattr(actions, "ACTION_LOCK_WAIT", 0.5)
    live = spool.enqueue("mail", {}, job_id="live").id
    with _client(spool) as client:
        token = _csrf(client)
        with holding_lock(Path(spool.root)):
            started = time.monotonic()
            refused = client.post(f"/job/{live}/cancel", data={"csrf": token})
            waited = time.monotonic() - started
        shown = client.get(refused.headers["location"]).text
        assert spool.get(live).state is JobState.READY
        done = client.post(f"/job/{live}/cancel", data={"csrf": token})
    assert refused.status_code == 303 and waited < 30
    assert "nothing was done" in shown and "spool lock" in shown
    assert done.status_code == 303 and spool.get(live).state is JobState.CANCELED


def test_a_long_notice_is_kept_whole_up_to_its_bound_and_marked_where_cut() -> None:
    """Found in a dashboard probe: notices were cut at 300 characters, mid-sentence, and a
    refused restore lost the remedy its last words give."""
    from urllib.parse import unquote

    from jobspool.dashboard.web import NOTICE_CHARS, redirect

    remedy = "x" * 400 + " repair it in place first, or `jobspool quarantine purge NAME`"
    kept = redirect("/", remedy).headers["set-cookie"]
    assert remedy in unquote(kept)
    cut = unquote(redirect("/", "y" * (NOTICE_CHARS + 50)).headers["set-cookie"])
    assert ("y" * (NOTICE_CHARS - 1) + "…") in cut and len(kept) < 4000
