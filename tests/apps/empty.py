"""An `--app` with no handlers: the CLI must refuse it (exit 1)."""

from __future__ import annotations

from jobspool import App

app = App(handlers={})

handlers: dict[str, object] = {}
