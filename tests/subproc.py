"""What tests that run jobspool in subprocesses share: the repo root and the environment."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli_env(**extra: str) -> dict[str, str]:
    """The test's environment with the source tree importable and no ambient spool."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.pop("JOBSPOOL_ROOT", None)
    env.update(extra)
    return env
