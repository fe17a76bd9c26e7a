"""`maintain` on a store that accepts connections and never answers: the listing of its
tables is bounded (by `LIST_SECONDS`, or the budget when larger), then one error; it
waited as long as the stall lasted, before its budget had even started."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from jobspool.errors import ProjectionError
from jobspool.projection import maintenance
from jobspool.projection.lance import ProjectionStore


def test_a_listing_that_never_returns_is_given_up(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def stalled(self: Any) -> list[str]:
        release.wait(120)
        return []

    monkeypatch.setattr(ProjectionStore, "table_names", stalled)
    monkeypatch.setattr(maintenance, "LIST_SECONDS", 0.3, raising=False)
    index = tmp_path / "index"
    index.mkdir()
    done: list[Any] = []

    def run() -> None:
        try:
            maintenance.maintain(str(index), budget_seconds=0.1, call_timeout=600.0)
        except Exception as exc:  # handed to the test thread
            done.append(exc)
        else:
            done.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)  # a hang guard: the bound is 0.3 s, the stall 120 s
    release.set()
    assert not worker.is_alive()
    assert isinstance(done[0], ProjectionError), done
    assert "could not list the tables" in str(done[0])
