"""An idle worker whose LISTEN cannot reconnect says so once per outage, not at every retry
(once a second per process for the whole outage: a PostgreSQL chaos probe), and says when
it listens again."""

from __future__ import annotations

import logging
import socket

import pytest

from jobspool.pg.db import Database
from jobspool.pg.notify import NotifyWatcher


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_listen_that_cannot_reconnect_is_logged_once_per_outage(
        pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import jobspool.pg.notify as notify

    down = Database(f"postgresql://nobody@127.0.0.1:{_free_port()}/none?connect_timeout=2")
    clock = [1000.0]
    monkeypatch.setattr(notify.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="jobspool.pg"):
        watcher = NotifyWatcher(down, "jobspool")
        for _ in range(5):
            clock[0] += 2.0  # past each retry's second
            assert watcher.wait(0.0) is False
        said = [r.getMessage() for r in caplog.records if "LISTEN" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("cannot LISTEN")
        watcher.db = Database(pg_url)  # the server is back
        clock[0] += 2.0
        assert watcher.wait(0.0) is True  # claim at once: what arrived meanwhile went unheard
        said = [r.getMessage() for r in caplog.records if "LISTEN" in r.getMessage()]
        assert said[1:] == [f"LISTEN on {watcher.db.display} again"]
        watcher.close()
