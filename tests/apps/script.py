"""A script, not an app module: importing it runs its main(), which exits
(`--app tests.apps.script:app`)."""

from __future__ import annotations

import sys


def main() -> int:
    return 3


sys.exit(main())
