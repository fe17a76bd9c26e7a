"""The one factory tests open a `Spool` through, and its fixture.

`make_spool(root, **options)` is `Spool(root, **options)` with the one default that differs for
tests: `durable=False`, since a scratch spool needs no fsyncs (a test about durability passes
`durable=True`; `durable` is per opener, not persisted, so a spool prepared this way is the same
on disk to a later process). The `make_spool` fixture (registered from conftest) is the same
callable with `root` defaulting to the test's `spool_root`, and closes every spool it opened at
teardown; conftest's `spool` is one of its spools, so `make_spool()` beside it opens a peer on
the same directory. tests/store_params.py builds the both-store form (`make_any_spool`) on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from jobspool import Spool


def make_spool(root: str | os.PathLike[str], /, **options: Any) -> Spool:
    """Open a spool on `root` (a directory or a postgresql:// URL) for a test: not durable
    unless `durable=True` is given. The caller closes it (or uses it as a context manager)."""
    options.setdefault("durable", False)  # the PostgreSQL store ignores it
    return Spool(root, **options)


class SpoolFactory(Protocol):
    """The `make_spool` fixture: `make_spool(root=None, **options) -> Spool`."""

    def __call__(self, root: str | os.PathLike[str] | None = None, /, **options: Any
                 ) -> Spool: ...


def opener(default_root: str | os.PathLike[str]) -> tuple[SpoolFactory, Callable[[], None]]:
    """A factory whose `root` defaults to `default_root`, and the function closing all it opened
    (newest first)."""
    opened: list[Spool] = []

    def make(root: str | os.PathLike[str] | None = None, /, **options: Any) -> Spool:
        spool = make_spool(default_root if root is None else root, **options)
        opened.append(spool)
        return spool

    def close_all() -> None:
        for spool in reversed(opened):
            spool.close()

    return make, close_all


@pytest.fixture(name="make_spool")
def make_spool_fixture(spool_root: Path) -> Iterator[SpoolFactory]:
    """`make_spool(root=None, **options)`: spools on `spool_root` (or `root`), closed at
    teardown."""
    make, close_all = opener(spool_root)
    yield make
    close_all()
