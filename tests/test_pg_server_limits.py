"""Server settings an operator may have on the role or the server, met by the PostgreSQL store
as conditions to wait out, not refusals (found by an operator-slips probe):

- `idle_session_timeout`: the server ends a pooled connection that idled; the next statement
  failed ("refused enqueue: terminating connection due to idle-session timeout") and
  workers exited after five such failures;
- `lock_timeout` with an operator's `LOCK TABLE` held longer: every statement was cut off
  and taken for a refusal; workers exited with finished results thrown away, where
  without the timeout they waited for the lock (a `statement_timeout` stays a refusal: a
  statement always past it would be retried for ever);
- the connection slots kept for superusers: an ordinary role is told "remaining connection
  slots are reserved", which was not recognised as "too many clients".
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from jobspool import JobState, Worker
from jobspool.pg.db import transient
from tests.spools import make_spool

pytestmark = pytest.mark.slow


def _with_options(url: str, **settings: str) -> str:
    """`url` (pg_url: its query ends with `options=-csearch_path...`) with more `-c` settings
    in that libpq option, as an operator's role or server would have them."""
    assert "options=" in url.rsplit("&", 1)[-1]
    return url + "".join(f"%20-c{k}%3D{v}" for k, v in settings.items())


def test_a_connection_the_server_ended_for_idling_is_replaced_not_refused(pg_url: str) -> None:
    url = _with_options(pg_url, idle_session_timeout="300")
    with make_spool(url) as spool:
        spool.enqueue("k", 1, job_id="a")
        time.sleep(1.0)  # the pooled connection idles past the timeout: the server ends it
        spool.enqueue("k", 2, job_id="b")
        assert spool.get("b").state is JobState.READY
        time.sleep(1.0)

        def work(job, ctx):  # type: ignore[no-untyped-def]
            time.sleep(0.5)  # connections idle meanwhile, and are ended again
            return job.payload

        report = Worker(spool, handlers={"k": work}, concurrency=1, batch_size=1
                        ).run_until_idle()
        assert report.completed == 2
        assert {spool.get(i).state for i in ("a", "b")} == {JobState.COMPLETED}


def test_a_statement_cut_off_by_lock_timeout_is_sent_again_after_a_held_lock(
        pg_url: str) -> None:
    url = _with_options(pg_url, lock_timeout="200")
    with make_spool(pg_url) as setup:
        setup.enqueue("k", 0, job_id="before")
    locked = threading.Event()

    def operator() -> None:
        with psycopg.connect(pg_url) as conn, conn.transaction():
            conn.execute("LOCK TABLE jobspool_jobs IN ACCESS EXCLUSIVE MODE")
            locked.set()
            time.sleep(1.5)  # several lock timeouts of the spool's role

    holder = threading.Thread(target=operator)
    with make_spool(url) as spool:
        holder.start()
        try:
            assert locked.wait(30)
            spool.enqueue("k", 1, job_id="during")  # waits the lock out
            report = Worker(spool, handlers={"k": lambda job, ctx: None}).run_until_idle()
        finally:
            holder.join(60)
        assert report.completed == 2
        assert spool.get("during").state is JobState.COMPLETED


def test_a_statement_that_always_runs_past_statement_timeout_is_refused_at_once(
        pg_url: str) -> None:
    """Retried as an outage, a statement that always exceeds the role's timeout took 28 s
    and 19 lines to fail, and a worker ran every handler and settled nothing, for ever
    (a regression probe). It is a refusal: one line, at once."""
    from jobspool.errors import SpoolError, StoreUnavailable

    with make_spool(_with_options(pg_url, statement_timeout="300")) as spool:
        with pytest.raises(SpoolError) as caught:
            spool.db.run(lambda c: c.execute("SELECT pg_sleep(1)"),  # type: ignore[attr-defined]
                         what="a slow statement")
    assert not isinstance(caught.value, StoreUnavailable)
    assert "statement timeout" in str(caught.value)


def test_the_slots_kept_for_superusers_are_a_wait_not_a_refusal() -> None:
    full = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '
        "remaining connection slots are reserved for non-replication superuser connections")
    assert transient(full)
    wrong = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '
        'password authentication failed for user "app"')
    assert not transient(wrong)


def test_claims_of_many_sizes_keep_no_payloads_on_pooled_connections(pg_url: str) -> None:
    """Cursors kept per statement (to reuse their converters) kept their last result: the
    claim's text varies with its limit, so claiming 1..300 jobs of 60 KB kept one cursor
    and one claimed batch per limit on the connection, 2.7 GB (a regression probe)."""
    from jobspool.pg import hotcursor as dbmod

    with make_spool(pg_url) as spool:
        spool.enqueue_many("big", ["x" * 20_000 for _ in range(40)])
        for limit in range(1, 41):
            for lease in spool.claim(kinds="big", limit=limit, owner="o", lease_seconds=60):
                spool.release(lease)
        for _ in range(3):
            spool.enqueue("small", 1)  # the INSERT's cursor is kept: its rows are ids
        pool = spool.db._pool  # type: ignore[attr-defined]
        assert pool is not None
        for conn in pool._idle:  # noqa: SLF001 - what each idle connection holds
            kept = getattr(conn, dbmod._HOT_CURSORS, {})  # noqa: SLF001
            assert len(kept) <= dbmod._HOT_MAX  # noqa: SLF001
            held = sum(len(cur.pgresult.get_value(r, c) or b"")
                       for cur in kept.values() if cur.pgresult is not None
                       for r in range(cur.pgresult.ntuples)
                       for c in range(cur.pgresult.nfields))
            assert held < 10_000, held
