"""An `--app` module that raises while it is imported: the CLI must exit 1 with one line."""

from __future__ import annotations

raise RuntimeError("tests.apps.broken refuses to be imported")
