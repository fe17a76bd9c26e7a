"""Two processes making one new projection table at once: Lance committed the creation that
lost the race as an overwrite on top of the winner's table (of 400 rounds of 4 processes,
one ended with an empty overwrite at version 3, wiping a merge another process had been
told was written). Creation in a local database is serialised, and the second creator,
which looked before the first had made it, writes into the table instead of making it."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import lancedb
import portalocker
import pytest

from jobspool.projection import lance
from jobspool.projection.handler import make_upsert
from jobspool.projection.lance import ProjectionStore
from tests.spawned import at_once


def test_a_second_creator_waits_for_the_first_and_writes_into_its_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "proj")
    Path(uri).mkdir()
    done = threading.Event()
    second = ProjectionStore(uri)

    def create_too() -> None:
        assert second.apply([make_upsert("b", "t", [{"id": "b", "n": 2}], 1.0, 2)]).ok
        done.set()

    # Another process is making table "t": it holds the creation lock.
    with portalocker.Lock(str(Path(uri) / ".t.creating.lock"), mode="a", timeout=5):
        racer = threading.Thread(target=create_too)
        racer.start()
        assert not done.wait(2.0)  # the second creator waits instead of making it too
        # The first creator (this test holds its lock, as that process would) makes the
        # table and writes its row.
        monkeypatch.setattr(lance, "creating", lambda uri, name: contextlib.nullcontext())
        first = ProjectionStore(uri)
        assert first.apply([make_upsert("a", "t", [{"id": "a", "n": 1}], 1.0, 1)]).ok
        monkeypatch.undo()
    racer.join(60)
    assert done.is_set()
    table = lancedb.connect(uri).open_table("t")
    assert sorted(table.to_arrow().column("id").to_pylist()) == ["a", "b"]
    assert [v["version"] for v in table.list_versions()] == [1, 2, 3]  # one creation


ROUNDS, WRITERS = 12, 4


def _writer(index: int, uri: str, barrier: Any) -> None:
    store = ProjectionStore(uri)
    for r in range(ROUNDS):
        barrier.wait(timeout=120)
        rows = [{"id": f"k{k}", "val": index} for k in range(3)] + [{"id": f"w{index}",
                                                                       "val": index}]
        for _ in range(20):  # a lost commit race is retried, as a worker retries its job
            if store.apply([make_upsert(f"j{index}-{r}", f"t{r}", rows, 1.0,
                                        100 + index)]).ok:
                break


def test_processes_making_one_table_at_once_lose_no_confirmed_write(tmp_path: Path) -> None:
    uri = str(tmp_path / "proj")
    at_once(_writer, WRITERS, uri, timeout=300)
    conn = lancedb.connect(uri)
    for r in range(ROUNDS):
        ids = Counter(conn.open_table(f"t{r}").to_arrow().column("id").to_pylist())
        assert ids == Counter({f"k{k}": 1 for k in range(3)} | {f"w{i}": 1
                                                                 for i in range(WRITERS)})
