"""What may not live inside a spool's own directories is refused however the paths are
spelled: a symlink to the spool (or into it) is not a way in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobspool import Spool, Worker
from jobspool.errors import ConfigError, SpoolError


def _noop(job: object, ctx: object) -> None:
    return None


@pytest.mark.parametrize("via", ["root through a symlink", "projection through a symlink"])
def test_a_projection_in_the_spools_tmp_is_refused_through_a_symlink(tmp_path: Path,
                                                                       via: str) -> None:
    real, link = tmp_path / "real", tmp_path / "link"
    Spool(real, create=True).close()
    link.symlink_to(real)
    root, projection = ((link, real / "tmp" / "idx") if via.startswith("root")
                        else (real, link / "ready" / "idx"))
    with Spool(root) as spool, pytest.raises(ConfigError, match="inside the spool's own"):
        Worker(spool, {"k": _noop}, projection=str(projection))
    assert "idx" not in os.listdir(real / "tmp")
    assert "idx" not in os.listdir(real / "ready")


def test_a_spool_inside_another_spools_ready_is_refused_through_a_symlink(
        tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    Spool(outer, create=True).close()
    (tmp_path / "rl").symlink_to(outer / "ready")
    with pytest.raises(SpoolError, match="inside the spool"):
        Spool(tmp_path / "rl" / "inner", create=True)
    assert os.listdir(outer / "ready") == []


@pytest.mark.parametrize("spelling", ["~/tmp/idx", "file://~/tmp/idx"])
def test_a_projection_in_the_spools_tmp_is_refused_when_spelled_from_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str) -> None:
    """LanceDB expands `~`: the guard reads the path as LanceDB will write it."""
    root = tmp_path / "s"
    Spool(root, create=True).close()
    monkeypatch.setenv("HOME", str(root))
    with Spool(root) as spool, pytest.raises(ConfigError, match="inside the spool's own"):
        Worker(spool, {"k": _noop}, projection=spelling)
