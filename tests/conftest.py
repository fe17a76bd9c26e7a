"""Shared fixtures: a fake clock, scratch spools, and the hypothesis profile."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers_spool import FakeClock  # noqa: E402 - after the sys.path fix above

if TYPE_CHECKING:  # imported for real as a plugin below, so pytest can rewrite its asserts
    from jobspool import Spool
    from tests.spools import SpoolFactory

# The PostgreSQL store's fixtures (issue 16): `pg_server` (session) and `pg_url` (a fresh schema).
# `spool_store`/`any_spool`/`make_any_spool` run a contract test against each store (tests/store_params.py).
# `s3_server` (session): a SeaweedFS for the projection on s3:// (tests/s3server.py).
# `make_spool(root=None, **options)`: the one way tests open a Spool (tests/spools.py).
pytest_plugins = ["tests.pgserver", "tests.spools", "tests.store_params", "tests.s3server"]

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def spool_root(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def spool(make_spool: SpoolFactory, clock: FakeClock) -> Spool:
    """A scratch spool on `spool_root` with the fake clock and 30 s leases."""
    return make_spool(clock=clock, lease_seconds=30.0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Leave proof that the session ended normally, where `.ci/run` asks for it: a process
    that exits from under pytest (`os._exit(0)` in code under test) ends with status 0 and
    no summary, which CI would otherwise count as green."""
    proof = os.environ.get("JOBSPOOL_TESTS_FINISHED")
    if proof:
        Path(proof).write_text(f"{session.testscollected} collected, exit status {exitstatus}\n")
