"""Fixtures that run one test against every store (CONVENTIONS: one contract suite per store).

`spool_store` is "file" or "postgresql"; `store_root` the matching `Spool` root (a fresh directory,
or a URL whose search_path is a fresh schema, see tests/pgserver.py); `make_any_spool(**options)`
opens spools on that root (closed at teardown); `any_spool` is one with the defaults the
contract tests assume. Both stores run on the real clock: the PostgreSQL store takes time from
the database, so a FakeClock could not move it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobspool import Spool
from tests.spools import opener

STORES = ["file", "postgresql"]


@pytest.fixture(params=STORES)
def spool_store(request: pytest.FixtureRequest) -> str:
    """The store under test: "file" or "postgresql"."""
    return str(request.param)


@pytest.fixture
def store_root(spool_store: str, request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """What `Spool(...)` is given for this store."""
    if spool_store == "file":
        return tmp_path / "s"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def make_any_spool(store_root: str | Path) -> Iterator[Callable[..., Spool]]:
    """Open a `Spool` on this test's root with the given options (tests/spools.py's factory:
    not durable unless asked); all closed at teardown."""
    make, close_all = opener(store_root)
    yield lambda **options: make(**options)
    close_all()


@pytest.fixture
def any_spool(make_any_spool: Callable[..., Spool]) -> Spool:
    """A spool of the store under test: 30 s leases, 5 attempts, default backoff."""
    return make_any_spool(lease_seconds=30.0)


def sleep_past(moment: float) -> None:
    """Sleep until the wall clock (which both stores read) has passed `moment`."""
    while (left := moment - time.time()) >= 0:
        time.sleep(left + 0.01)
