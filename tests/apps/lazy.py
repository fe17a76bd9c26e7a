"""A module whose attributes load lazily, and fail: `--app tests.apps.lazy:app`."""

from __future__ import annotations


def __getattr__(name: str) -> object:
    raise RuntimeError("lazy load failed")
