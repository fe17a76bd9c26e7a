"""One process, one spool, two roots that differ even by real path (a bind mount): it has
one liveness mark, and closing the spool opened through one spelling leaves it alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

_SCENARIO = textwrap.dedent("""
    import json, os, subprocess, sys
    from jobspool import Spool
    work = sys.argv[1]
    real, view = os.path.join(work, "sp"), os.path.join(work, "view")
    os.makedirs(view)
    first = Spool(real, create=True, lease_seconds=300)
    subprocess.run(["mount", "--bind", work, view], check=True)
    second_root = os.path.join(view, "sp")
    assert os.path.realpath(second_root) != os.path.realpath(real)
    first.enqueue("k", {}, job_id="held")
    first.enqueue("k", {}, job_id="other")
    [held] = first.claim(limit=1)
    second = Spool(second_root)
    [other] = second.claim(limit=1)
    second.complete(other, "done")
    second.close()
    out = subprocess.run([sys.executable, "-c",
        "import sys; from jobspool import Spool; s = Spool(sys.argv[1]);"
        "print(s.reclaim_dead()); print(s.get('held').state)", real],
        capture_output=True, text=True, check=True)
    reclaimed, state = out.stdout.split()
    first.heartbeat(held)
    first.complete(held, "ok")
    print(json.dumps({"held": held.job_id, "reclaimed": int(reclaimed), "state": state,
                      "final": first.get(held.job_id).state}))
""")


def test_closing_a_second_spelling_of_the_root_keeps_the_process_alive(tmp_path: Path) -> None:
    script = tmp_path / "scenario.py"
    script.write_text(_SCENARIO)
    # A mount namespace of its own: the bind mount goes with the process (as root, or as
    # an unprivileged user mapped to root in a user namespace).
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.insert(1, "--map-root-user")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([*unshare, sys.executable, str(script), str(tmp_path / "w")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["reclaimed"] == 0 and got["state"] == "leased", got
    assert got["final"] == "completed", got
