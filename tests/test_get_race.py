"""`get` racing an enqueue of the same id (a client polling GET /jobs/ID while its POST
is handled) said "its file ready/ID.json cannot be read; run `jobspool recover`" for a
file that read fine: the locked second look found nothing, then the check for an
unreadable file, outside the lock, found the file the enqueue had just published."""

from __future__ import annotations

import threading
from pathlib import Path

from jobspool.errors import JobNotFound, SpoolError
from tests.spools import make_spool

N = 400


def test_get_during_an_enqueue_of_its_id_is_not_found_or_the_job(tmp_path: Path) -> None:
    with make_spool(tmp_path / "s") as producer, make_spool(tmp_path / "s") as reader:
        current = {"i": 0}
        done = threading.Event()
        false_alarms: list[str] = []
        found = [0]

        def poll() -> None:
            while not done.is_set():
                job_id = f"x-{current['i']}"
                try:
                    reader.get(job_id)
                    found[0] += 1
                except JobNotFound:
                    pass
                except SpoolError as exc:
                    false_alarms.append(str(exc))

        thread = threading.Thread(target=poll)
        thread.start()
        try:
            for i in range(N):
                current["i"] = i
                producer.enqueue("k", {"i": i}, job_id=f"x-{i}")
        finally:
            done.set()
            thread.join(60)
    assert false_alarms == [], (len(false_alarms), false_alarms[:1])
    assert found[0] > 0
