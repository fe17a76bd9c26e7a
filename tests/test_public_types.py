"""The typed API as a user's `mypy --strict` sees it (jobspool ships py.typed).

A typo'd import type-checked as Any (the lazy-loading module `__getattr__` was visible to
checkers); the README's `spool.recover(app.replay)`, `App(projection=Path(...))` and
`Policy(retry_on=OSError)` were refused while they work; a handler of the wrong arity
passed in an `App`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

USER_CODE = textwrap.dedent('''
    from pathlib import Path

    import jobspool
    from jobspool import App, Context, Job, Policy, Spool


    def note(job: Job, ctx: Context) -> None:
        return None


    def replay_note(job: Job) -> str:
        return "unknown"


    app = App(handlers={"note": note}, replay={"note": replay_note},
              projection=Path("/tmp/index"), policies={"note": Policy(retry_on=OSError)})
    spool = Spool("/tmp/spool")
    spool.recover(app.replay)
    worker = jobspool.Worker(spool, app)
''')

MISTAKES = textwrap.dedent('''
    import jobspool
    from jobspool import App, Job, Wrker  # MISTAKE-1


    def one_arg(job: Job) -> None:
        return None


    App(handlers={"note": one_arg})  # MISTAKE-2
    jobspool.Workr  # MISTAKE-3
''')


def _mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir()
    src = tmp_path / "user_app.py"
    src.write_text(code)
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           "--cache-dir", str(tmp_path / "cache"), str(src)],
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[1])


def test_the_readmes_typed_uses_check_and_typos_do_not(tmp_path: Path) -> None:
    good = _mypy(tmp_path / "good", USER_CODE)
    assert good.returncode == 0, good.stdout
    bad = _mypy(tmp_path / "bad", MISTAKES)
    lines = bad.stdout.splitlines()
    for n in (3, 10, 11):  # the three mistakes, by line (the text's first line is blank)
        assert any(f"user_app.py:{n}:" in line for line in lines), bad.stdout
