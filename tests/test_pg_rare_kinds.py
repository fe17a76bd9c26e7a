"""PostgreSQL: work for a few kinds behind a large backlog of another kind.

A worker for kinds that have few jobs, beside a backlog of 200,000 jobs of a kind
it does not handle, spent 45-85 ms on each claim and 100 ms on each "when is the
next job due" (every idle wakeup, every NOTIFY of an enqueue of any kind): the
generic plans read the whole backlog. These tests measure the work the statements
do as the pooled connections plan them (`force_generic_plan`), in buffers touched
(`EXPLAIN (ANALYZE, BUFFERS)`), never in time; and check `next_due_at` against a
computation from the jobs themselves, on both branches of its statement.
"""

from __future__ import annotations

import json
import random
import re
import secrets
from typing import Any

import psycopg
import pytest

from jobspool import Spool
from jobspool.pg import sql
from jobspool.pg.pool import SESSION


def _generic_buffers(url: str, text: str, params: dict[str, Any]) -> int:
    """Buffers one execution of `text` touches, planned generically as a pooled connection
    plans its prepared statements, inside a transaction that is rolled back."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)[sb]", number, text)
    args = [params[n] for n in names]
    with psycopg.connect(url) as conn:
        conn.execute(SESSION)
        # Sent as a simple query: through the extended protocol, the server read the
        # body's $n as parameters of the PREPARE itself.
        result = conn.pgconn.exec_(("PREPARE probe AS " + prepared).encode())
        assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, result.error_message
        holes = "(" + ", ".join(["%s"] * len(args)) + ")" if args else ""
        # Arguments as literals (a client-side cursor), which EXECUTE casts to the types
        # the PREPARE inferred.
        row = psycopg.ClientCursor(conn).execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe{holes}", args).fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def _fill(url: str, start: int, end: int) -> None:
    with Spool(url) as spool:
        for first in range(start, end, 2000):
            spool.enqueue_many("bulk", [{"i": i} for i in range(first, min(end, first + 2000))])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE jobspool_jobs")


def _claim_params() -> dict[str, Any]:
    return {"now": None, "max_rescues": 10, "owner": "probe", "lease": 60.0,
            "proc": secrets.token_hex(8), "exclude": [], "started": None}


STATEMENTS = {
    "claim of a rare kind and an absent one": (lambda: sql.claim_sql(["rare", "absent"], 5), _claim_params),
    "next due, rare kinds": (lambda: sql.next_due_sql(("other", "rare")), lambda: {"now": None}),
    "next due, the backlog's kind": (lambda: sql.next_due_sql(("bulk",)),
                                     lambda: {"now": None}),
    "next due, every kind": (lambda: sql.next_due_sql(None), lambda: {"now": None}),
}


@pytest.mark.parametrize("name", list(STATEMENTS))
def test_work_does_not_grow_with_a_backlog_of_another_kind(pg_url: str, name: str) -> None:
    """The same statement, as a pooled connection plans it, behind 1,000 due jobs of
    another kind and then behind 21,000: the buffers it touches stay the same (give or
    take a page of a deeper index), where reading the backlog costs 20 times more."""
    text, params = STATEMENTS[name]
    with Spool(pg_url) as spool:
        # Behind the backlog in claim order, however many jobs join it.
        spool.enqueue_many("rare", [{"i": i} for i in range(5)], priority=5)
        spool.enqueue("other", {"i": 0}, delay=3600, priority=5)
    _fill(pg_url, 0, 1000)
    small = _generic_buffers(pg_url, text(), params())
    _fill(pg_url, 1000, 21_000)
    large = _generic_buffers(pg_url, text(), params())
    assert large <= small + 10, (small, large)


def test_claims_and_next_due_for_rare_kinds_through_the_api(pg_url: str) -> None:
    with Spool(pg_url) as spool:
        spool.enqueue_many("rare", [{"i": i} for i in range(5)])
        spool.enqueue("other", {"i": 0}, delay=3600)
    _fill(pg_url, 0, 4000)
    with Spool(pg_url) as spool:
        got = spool.claim(kinds=["rare", "other"], limit=10, owner="w", lease_seconds=60)
        assert sorted(lease.job.kind for lease in got) == ["rare"] * 5
        due = spool.next_due_at(["other", "rare"])
        # The lease just taken expires first: in 60 s, before the delayed job's hour.
        assert due is not None and spool.now() + 50 < due < spool.now() + 61
        assert spool.next_due_at(["bulk"]) is None  # all due already
        assert spool.next_due_at(["nope"]) is None
        assert spool.next_due_at(["bad kind!"]) is None
        assert spool.next_due_at([]) is None


def _expected(spool: Any, kinds: set[str] | None, now: float) -> float | None:
    times = []
    for job in spool.jobs():
        if kinds is not None and job.kind not in kinds:
            continue
        if job.state.value == "retryable" and job.run_at > now:
            times.append(job.run_at)
        if job.state.value == "leased" and job.lease.expires_at > now:
            times.append(job.lease.expires_at)
    return min(times, default=None)


@pytest.mark.parametrize("priorities", [3, 400], ids=["few-priorities", "many-priorities"])
def test_next_due_matches_the_jobs_themselves(pg_url: str, priorities: int) -> None:
    """Both branches: the skip scan over (kind, priority) pairs, and past 256 pairs the
    plain scan. Ready rows dated ahead (a producer whose clock runs ahead) are due now,
    as on the file spool: not in the answer."""
    rng = random.Random(priorities)
    t = [1_000_000.0]
    with Spool(pg_url, clock=lambda: t[0]) as spool:
        for i in range(600):
            spool.enqueue(rng.choice(["a", "b", "c.d", "e-f"]), {"i": i},
                          priority=rng.randrange(priorities),
                          delay=rng.choice([0.0, 0.0, rng.uniform(1, 5000)]))
        for lease in spool.claim(limit=20, owner="w", lease_seconds=rng.uniform(10, 900)):
            if rng.random() < 0.5:
                spool.fail(lease, "again", delay=rng.uniform(1, 5000))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE jobspool_jobs SET run_at = run_at + 777 WHERE id IN "
                         "(SELECT id FROM jobspool_jobs WHERE state = 'ready' LIMIT 3)")
        for kinds in (None, {"a"}, {"b", "c.d"}, {"e-f", "zz"}, {"a", "b", "c.d", "e-f"}):
            for now in (t[0], t[0] + 800, t[0] + 3000, t[0] + 9000):
                t[0] = now
                want = _expected(spool, kinds, now)
                got = spool.next_due_at(None if kinds is None else sorted(kinds))
                assert (got is None) == (want is None), (kinds, now, got, want)
                if want is not None:
                    assert got == pytest.approx(want, abs=1e-6), (kinds, now)
            t[0] = 1_000_000.0


def test_kinds_given_as_str_subclasses_are_claimed(pg_url: str) -> None:
    """A StrEnum member is a kind the spool takes (as the file spool does); written into
    the statement's text it must be its value, not its name."""
    import enum

    from jobspool import Worker

    class Kind(enum.StrEnum):
        INDEX = "index.notes"

    with Spool(pg_url) as spool:
        spool.enqueue(Kind.INDEX, {"i": 1})
        spool.enqueue(Kind.INDEX, {"i": 2}, delay=3600)
        assert spool.next_due_at([Kind.INDEX]) is not None
        report = Worker(spool, handlers={Kind.INDEX: lambda job, ctx: None}).run_until_idle()
        assert report.completed == 1 and report.crashes == 0
