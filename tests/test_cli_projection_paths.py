"""`--projection` with a `~` or `$VAR` no shell expanded is refused, as `--root` is: the
workers (LanceDB expands `~`) and the operator's tools (which did not) disagreed on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_harness import one_error_line, run_cli


@pytest.mark.parametrize("command", [["run-until-idle", "--app", "tests.apps.ledger:app"],
                                     ["maintain"], ["health"]])
@pytest.mark.parametrize("projection", ["~/idx", "$HOME/idx", "${HOME}/idx", "file://~/idx"])
def test_an_unexpanded_projection_path_is_refused_in_one_line(tmp_path: Path, command: list[str],
                                                              projection: str) -> None:
    assert run_cli("init", root=tmp_path / "s").code == 0
    result = run_cli(*command, "--projection", projection, root=tmp_path / "s",
                     env={"HOME": str(tmp_path / "home")})
    line = one_error_line(result, 1)  # a usage error, as the same mistake in --root
    assert "no shell expanded" in line and projection in line, line
    assert not (tmp_path / "home").exists()
