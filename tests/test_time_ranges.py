"""Times out of any range jobspool writes: a hand-edited job file with `run_at` of 1e300
is an unreadable file (quarantined by `recover`), not a job `stats` prints a 300-digit age
for; a lease of 1e300 seconds is refused where it is asked for, in one line."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobspool import Spool
from jobspool.errors import InvalidJob
from tests.cli_harness import run_cli
from tests.spools import make_spool


@pytest.mark.parametrize(("field", "value"), [("run_at", 1e300), ("run_at", -1e300),
                                              ("updated_at", 1e19)])
def test_a_hand_edited_time_out_of_range_makes_the_file_unreadable(
        tmp_path: Path, field: str, value: float) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        spool.enqueue("k", {}, job_id="odd")
        spool.enqueue("k", {}, job_id="fine")
    path = root / "ready" / "odd.json"
    doc = orjson.loads(path.read_bytes())
    doc[field] = value
    path.write_bytes(orjson.dumps(doc))
    stats = run_cli("stats", "--json", root=root)
    assert stats.code == 0
    assert orjson.loads(stats.out)["counts"]["ready"] == 1
    assert "e+" not in stats.out  # no 300-digit (or exponent) age anywhere
    listed = run_cli("list", "--json", root=root)
    assert [j["id"] for j in orjson.loads(listed.out)] == ["fine"]
    assert run_cli("fsck", root=root).code == 2
    assert run_cli("recover", root=root).code == 0
    assert (root / "quarantine").exists() and not path.exists()


@pytest.mark.parametrize("where", ["spool", "claim"])
def test_a_lease_of_absurd_length_is_refused_in_one_line(tmp_path: Path, where: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        if where == "spool":
            Spool(tmp_path / "s", lease_seconds=1e300)
        else:
            with make_spool(tmp_path / "s") as spool:
                spool.enqueue("k", {})
                spool.claim(lease_seconds=1e300)
    assert "lease_seconds" in str(caught.value) and "\n" not in str(caught.value)
