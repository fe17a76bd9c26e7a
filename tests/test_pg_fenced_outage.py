"""A `fenced` block on PostgreSQL through a lost connection (issue 16: "a database that goes
away is survived").

Found probing the store under trouble: a block opened on a pooled connection a server
restart or a terminated backend had killed failed at once with the driver's raw error
(`psycopg.errors.AdminShutdown` and its traceback in the handler), charging the job an
attempt for an outage it never saw, while heartbeats and settles sent again. Nothing of a
block has run when it is opened, so it is now opened again; a connection lost inside a
block is one line saying so, and what the block did is rolled back.
"""

from __future__ import annotations

import psycopg
import pytest

from jobspool import JobState
from jobspool.errors import StoreUnavailable
from tests.pgserver import PgServer
from tests.spools import make_spool


def _kill_other_backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def test_a_block_opened_after_its_pooled_connection_was_killed_runs(pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", job_id="j")
        (lease,) = spool.claim()
        assert _kill_other_backends(pg_url) >= 1  # the pool's idle connection, dead
        with spool.fenced(lease):
            spool.enqueue("child", job_id="c")  # the outbox pattern, in the block
        assert spool.complete(lease, "ok").state is JobState.COMPLETED
        assert spool.get("c").state is JobState.READY


@pytest.mark.slow
def test_a_block_opened_after_a_server_restart_runs_once(pg_server: PgServer,
                                                         pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", job_id="j")
        (lease,) = spool.claim()
        # Every connection of the pool made and left idle, as a busy worker leaves them;
        # then all of them dropped by the restart, the server back.
        pool = spool.db._get_pool()  # type: ignore[attr-defined]  # noqa: SLF001
        for conn in [pool.take(5.0) for _ in range(pool.size)]:
            pool.give(conn)
        pg_server.restart()
        entered = 0
        with spool.fenced(lease):
            entered += 1
            spool.enqueue("child", job_id="c")
        assert entered == 1
        assert spool.complete(lease, "ok").state is JobState.COMPLETED
        assert spool.get("c").state is JobState.READY


def test_a_connection_lost_inside_a_block_is_one_line_and_rolls_the_block_back(
        pg_url: str) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("k", job_id="j")
        (lease,) = spool.claim()
        with pytest.raises(StoreUnavailable) as caught, spool.fenced(lease):
            spool.enqueue("child", job_id="c1")
            _kill_other_backends(pg_url)  # the block's own connection among them
            spool.enqueue("child", job_id="c2")
        said = str(caught.value)
        assert "connection lost" in said and "rolled back" in said and "\n" not in said
        assert "refused" not in said
        assert [j.id for j in spool.jobs(kind="child")] == []
        assert spool.complete(lease, "ok").state is JobState.COMPLETED


_HUNG_IN_BLOCK = """
import sys, threading, time
from jobspool import Policy, Spool, Worker
release = threading.Event()
hung = int(sys.argv[2])
# More hung handlers than the pool has connections: each ended block gives its slot back.
with Spool(sys.argv[1], pool_size=4) as spool:
    spool.enqueue_many("hang", [None] * hung, job_ids=[f"h{i}" for i in range(hung)],
                       max_attempts=1)
    def handler(job, ctx):
        with ctx.fenced():
            spool.enqueue("child", job_id="c" + job.id)
            release.wait(300)  # hung, holding its block open
    report = Worker(spool, {"hang": handler}, policies={"hang": Policy(timeout=1)},
                    concurrency=2, batch_size=2).run_until_idle()
    states = {spool.get(f"h{i}").state.value for i in range(hung)}
    print(report.timed_out, ",".join(sorted(states)), len(list(spool.jobs(kind="child"))))
    release.set()
"""


def test_a_handler_hung_inside_its_block_past_its_time_limit_does_not_hang_the_run(
        pg_url: str) -> None:
    # A sync handler cannot be stopped; hung inside a fenced block, its transaction held
    # the job's row lock, and the worker's record of the time limit waited on it for as
    # long as the handler ran (for ever, for a handler that never returns).
    import subprocess
    import sys

    from tests.subproc import REPO, cli_env

    proc = subprocess.Popen([sys.executable, "-c", _HUNG_IN_BLOCK, pg_url, "6"], cwd=REPO,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=60)  # a guard against the hang, not a timing
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the run waited on the hung handler's fenced block")
    assert proc.returncode == 0, err
    # Each timed out (one attempt: dead-lettered), and what its block did rolled back.
    assert out.split() == ["6", "dead_letter", "0"], (out, err)
    assert "no free connection" not in err, err
    assert "ended the fenced block of a handler abandoned" in err


def test_a_block_nested_in_one_whose_connection_was_lost_is_one_line(pg_url: str) -> None:
    # Found probing this change: the savepoint of the nested block failed before anything
    # turned the driver's error into ours; the raw AdminShutdown reached the handler.
    with make_spool(pg_url) as spool:
        spool.enqueue("k", job_id="j")
        (lease,) = spool.claim()
        with pytest.raises(StoreUnavailable) as caught, spool.fenced(lease):
            _kill_other_backends(pg_url)
            with spool.fenced(lease):
                pass
        assert "\n" not in str(caught.value) and "fenced block" in str(caught.value)
        assert spool.complete(lease, "ok").state is JobState.COMPLETED


def test_a_connection_lost_saving_schedule_marks_is_one_line_and_the_tick_fires_once(
        pg_url: str) -> None:
    # Found probing: the statements saving the marks ran on the block's connection bare; a
    # connection lost there killed a worker with the driver's raw AdminShutdown.
    from jobspool import Schedule, Scheduler

    with make_spool(pg_url) as spool:
        real = spool.enqueue_result
        kills = [1]

        def enqueue_then_lose_the_connection(kind, *args, **kwargs):  # type: ignore[no-untyped-def]
            out = real(kind, *args, **kwargs)
            if kills:
                kills.pop()
                _kill_other_backends(pg_url)  # the marks block's own connection among them
            return out

        spool.enqueue_result = enqueue_then_lose_the_connection  # type: ignore[method-assign]
        scheduler = Scheduler([Schedule("tick", every=1, catch_up="all")])
        now = spool.now()
        with pytest.raises(StoreUnavailable) as caught:
            scheduler.tick(spool, now=now)
        assert "schedule marks" in str(caught.value) and "\n" not in str(caught.value)
        assert list(spool.jobs(kind="tick")) == []  # rolled back with the marks
        fired = scheduler.tick(spool, now=now)
        assert len(fired) == 1 and len(list(spool.jobs(kind="tick"))) == 1
        assert scheduler.tick(spool, now=now) == []
