"""A FIFO where a job file belongs (a hand's `mkfifo`): nothing blocks on it, and it is
named for what it is. It was quarantined with the reason "empty file" (the non-blocking
read returns nothing), which sent an operator looking for a truncated write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobspool import Spool
from jobspool.errors import CorruptFileWarning


@pytest.mark.filterwarnings("ignore:skipping unreadable job file ready/empty.json")
def test_a_fifo_in_a_state_directory_is_quarantined_as_what_it_is(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with Spool(root, durable=False) as spool:
        spool.enqueue("k", {}, job_id="good")
        os.mkfifo(root / "ready" / "fifo.json")
        (root / "ready" / "empty.json").write_bytes(b"")
        with pytest.warns(CorruptFileWarning, match="FIFO or special file"):
            assert [lease.job_id for lease in spool.claim(kinds="k", limit=5)] == ["good"]
        spool.recover()
    reasons = {p.name: p.read_text() for p in (root / "quarantine").rglob("*.reason")}
    fifo = [text for name, text in reasons.items() if "fifo" in name]
    empty = [text for name, text in reasons.items() if "empty" in name]
    assert len(fifo) == 1 and "FIFO" in fifo[0] and "empty file" not in fifo[0]
    assert len(empty) == 1 and "empty file" in empty[0]


def test_a_fifo_held_open_by_a_writer_or_a_socket_fails_no_whole_command(
        tmp_path: Path) -> None:
    """A FIFO another process holds open for writing read EAGAIN, taken for a machine short
    of resources: `stats`, `list` and `health` failed for the whole spool. A socket failed
    to open (ENXIO) and was quarantined as "No such device or address"."""
    import socket

    root = tmp_path / "s"
    with Spool(root, durable=False) as spool:
        spool.enqueue("k", {}, job_id="good")
        os.mkfifo(root / "ready" / "held.json")
        writer = os.open(root / "ready" / "held.json", os.O_RDWR | os.O_NONBLOCK)
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(str(root / "ready" / "sock.json"))
            with pytest.warns(CorruptFileWarning, match="FIFO or special file"):
                assert spool.stats().counts["ready"] >= 1
                assert "good" in [j.id for j in spool.jobs()]
            spool.recover()
        finally:
            os.close(writer)
            sock.close()
    reasons = {p.name: p.read_text() for p in (root / "quarantine").rglob("*.reason")}
    assert sorted(name.split(".")[2] for name in reasons) == ["held", "sock"]
    assert all("FIFO or special file" in text for text in reasons.values())
