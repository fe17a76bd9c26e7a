"""`jobspool list` prints jobs as it reads them: it held every job (and its JSON) before
printing, about 2 KB a job for text and 3.5 KB for `--json` — 1.4 GB for 400,000."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from tests.cli_harness import run_cli
from tests.spools import make_spool

N = 20_000


def _peak_of(*args: str, root: Path) -> tuple[int, str]:
    tracemalloc.start()
    try:
        done = run_cli(*args, root=root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert done.code == 0, done.err
    return peak, done.out


def test_list_holds_one_job_at_a_time_in_text_and_json(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{"n": i, "pad": "x" * 200} for i in range(N)])
    peak, out = _peak_of("list", root=root)
    assert len(out.splitlines()) == N
    # What stays is the listing's names (~100 B each) and the captured output itself
    # (StringIO here); holding every job on top was ~2 KB each.
    assert peak < len(out) * 4 + N * 400, (peak, len(out))
    peak, out = _peak_of("list", "--json", root=root)
    docs = json.loads(out)
    assert len(docs) == N and docs[0]["payload"]["n"] == 0
    assert peak < len(out) * 4 + N * 400, (peak, len(out))


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    # `jobspool list --json | head` printed two chained BrokenPipeError tracebacks (its
    # error line went to the same closed pipe).
    import subprocess
    import sys

    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{"n": i} for i in range(3000)])
    for args in (["list"], ["list", "--json"]):
        proc = subprocess.Popen([sys.executable, "-m", "jobspool", "--root", str(root), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(10)
        proc.stdout.close()  # the reader goes away
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert proc.wait(timeout=120) == 141 and "Traceback" not in err, err
