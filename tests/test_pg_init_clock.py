"""PostgreSQL store (issue 16), beside tests/test_pg_store.py: `jobspool init` run by several
processes at once creates the schema once, and lease expiry follows the database's clock,
so a host whose clock disagrees can neither steal a live lease nor lose its own."""

from __future__ import annotations

import subprocess
import sys

import orjson
import psycopg
import pytest

from jobspool import JobState
from tests.cli_harness import reap, start_jobspool
from tests.spools import make_spool
from tests.subproc import REPO, cli_env

pytestmark = pytest.mark.slow


def _done(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        reap(proc)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _scalar(url: str, query: str) -> object:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_init_run_by_several_processes_at_once_creates_the_schema_once(pg_url: str) -> None:
    procs = [start_jobspool("init", "--json", root=pg_url) for _ in range(4)]
    docs = []
    for proc in procs:
        rc, out, err = _done(proc)
        assert rc == 0 and "Traceback" not in err, err
        docs.append(orjson.loads(out))
    assert sorted(d["created"] for d in docs) == [False, False, False, True]
    versions = _scalar(pg_url, "SELECT array_agg(version ORDER BY version) FROM jobspool_schema")
    assert isinstance(versions, list) and versions == list(range(1, len(versions) + 1))
    with make_spool(pg_url, create=False) as spool:
        assert spool.enqueue("note", job_id="j").state is JobState.READY


_SKEWED = """
import sys, time
_real = time.time
time.time = lambda: _real() + float(sys.argv[2])  # this host's clock is off by argv[2] seconds
from jobspool import Spool
with Spool(sys.argv[1]) as spool:
    stolen = [x.job_id for x in spool.claim(limit=10, kinds=["held"])]
    own = spool.enqueue("mine", job_id="mine")
    (lease,) = spool.claim(kinds=["mine"], lease_seconds=30)
    spool.heartbeat(lease)
    done = spool.complete(lease, "ok")
    print(" ".join(stolen) or "-", own.state, done.state, flush=True)
"""


@pytest.mark.parametrize("skew", [3600.0, -3600.0], ids=["an hour ahead", "an hour behind"])
def test_a_host_whose_clock_disagrees_can_neither_steal_a_live_lease_nor_lose_its_own(
        pg_url: str, skew: float) -> None:
    with make_spool(pg_url) as spool:
        spool.enqueue("held", job_id="held")
        (lease,) = spool.claim(kinds=["held"], lease_seconds=30)
        proc = subprocess.Popen([sys.executable, "-c", _SKEWED, pg_url, str(skew)], cwd=REPO,
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        rc, out, err = _done(proc)
        assert rc == 0, err
        assert out.split() == ["-", "ready", "completed"]
        assert spool.complete(lease, "mine").result == "mine"  # our lease was never taken
        assert spool.get("held").attempts == 1
