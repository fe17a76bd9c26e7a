"""A file far larger than any job file in a state directory (a log or a dump copied in
by mistake) is refused unread: read whole, one 200 MB file took every claim, `stats`
and `recover` to a 1 GB peak, and a few GB would have killed every worker. DESIGN §6:
one bad file never stops the queue. The file here is sparse: 1 GiB long, no disk used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from jobspool.queue.storeread import MAX_FILE_BYTES
from tests.spools import SpoolFactory

GIB = 1 << 30


def _stray(root: Path) -> Path:
    path = root / "ready" / "huge.json"
    with open(path, "wb") as f:
        f.write(b'{"id": "huge", "x": "')
        f.truncate(GIB)
    return path


def test_a_huge_file_is_skipped_by_readers_and_quarantined_as_too_large(
        make_spool: SpoolFactory, spool_root: Path) -> None:
    assert MAX_FILE_BYTES < GIB
    spool = make_spool()
    job = spool.enqueue("k", {"i": 1})
    _stray(spool_root)
    leases = spool.claim(limit=5)
    assert [lease.job_id for lease in leases] == [job.id]
    spool.complete(leases[0])
    assert spool.stats().counts["completed"] == 1
    report = spool.recover()
    assert report.quarantined == ("ready/huge.json",)
    (reason,) = [p for p in (spool_root / "quarantine").iterdir() if p.suffix == ".reason"]
    assert "larger than any job file" in reason.read_text()


def test_reading_a_spool_with_a_huge_file_stays_small(make_spool: SpoolFactory,
                                                       spool_root: Path) -> None:
    """Peak memory of a fresh process listing the spool: a resource bound, not a timing.
    Read from /proc/self/status (VmHWM, this process image's own peak): getrusage's
    ru_maxrss keeps the peak of the image before exec, here the test runner's."""
    spool = make_spool()
    spool.enqueue("k", {"i": 1})
    _stray(spool_root)
    code = ("import json, sys, warnings\n"
            "warnings.simplefilter('ignore')\n"
            "from jobspool import Spool\n"
            "s = Spool(sys.argv[1], create=False)\n"
            "n = sum(1 for _ in s.jobs())\n"
            "s.claim(limit=5)\n"
            "hwm = [line for line in open('/proc/self/status') if line.startswith('VmHWM')]\n"
            "print(json.dumps([n, int(hwm[0].split()[1])]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(spool_root)], capture_output=True,
                          text=True, timeout=120, check=True)
    listed, peak_kib = json.loads(done.stdout)
    assert listed == 1
    assert peak_kib < 400 * 1024, peak_kib  # the file alone is 1,048,576 KiB
