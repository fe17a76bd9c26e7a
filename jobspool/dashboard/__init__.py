"""The web dashboard (`jobspool dashboard`, extra `jobspool[web]`): look at a spool and act on it.

`create_app(spool, read_only=..., token=...)` returns the ASGI app; the CLI
serves it with uvicorn. Starlette, uvicorn and Jinja2 are imported only
here, so the rest of jobspool works without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobspool.dashboard.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from jobspool.dashboard.app import create_app

        return create_app
    raise AttributeError(f"module 'jobspool.dashboard' has no attribute {name!r}")
