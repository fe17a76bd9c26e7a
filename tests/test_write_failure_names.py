"""A write refused by a directory names that directory, not the staging file that moved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

_SCENARIO = textwrap.dedent("""
    import json, os, sys
    from jobspool import Spool
    from jobspool.errors import WriteFailed
    spool = Spool(sys.argv[1], create=True)
    spool.enqueue("k", {}, job_id="j")
    [lease] = spool.claim(limit=1)
    os.chmod(os.path.join(sys.argv[1], "completed"), 0o500)
    try:
        spool.complete(lease, "r")
    except WriteFailed as exc:
        print(json.dumps({"message": str(exc), "path": exc.path}))
    finally:
        os.chmod(os.path.join(sys.argv[1], "completed"), 0o700)
""")


def test_a_read_only_state_directory_is_named_in_the_error(tmp_path: Path) -> None:
    script = tmp_path / "scenario.py"
    script.write_text(_SCENARIO)
    # Root writes anywhere: drop the capabilities that let it, as a spool's owner runs.
    drop = (["setpriv", "--inh-caps=-dac_override,-dac_read_search",
             "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else [])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([*drop, sys.executable, str(script), str(tmp_path / "s")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    completed = str(tmp_path / "s" / "completed")
    assert f"({completed}/)" in got["message"], got
    assert got["path"] == completed, got
    assert str(tmp_path / "s" / "tmp") not in got["message"], got  # the staging file moved
