"""A `Reservation` built again from stored fields (an outbox keeps job_id and
reservation_id in its own database) is checked like any job id: `../x` is refused before
any path is opened (DESIGN §2), and a NUL is the same one-line `InvalidJob` on both stores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobspool import InvalidJob, Reservation
from jobspool.errors import InvalidType
from tests.spools import make_spool


@pytest.mark.parametrize("job_id", ["../../outside/x", "../outside", "a\x00b", "", "a b"])
@pytest.mark.parametrize("op", ["commit", "abort"])
def test_a_reservation_with_a_bad_job_id_is_refused(store_root: str | Path, tmp_path: Path,
                                                     job_id: str, op: str) -> None:
    with make_spool(store_root) as spool:
        real = spool.prepare("k", {"a": 1}, job_id="real")
        forged = Reservation(job_id=job_id, reservation_id=real.reservation_id, job=real.job)
        with pytest.raises(InvalidJob, match="job id"):
            getattr(spool, op)(forged)
        assert spool.get("real").state.value == "prepared"  # type: ignore[union-attr]


def test_a_reservation_id_that_is_not_a_string_is_refused(store_root: str | Path) -> None:
    with make_spool(store_root) as spool:
        real = spool.prepare("k", {"a": 1}, job_id="real")
        forged = Reservation(job_id="real", reservation_id=7, job=real.job)  # type: ignore[arg-type]
        with pytest.raises(InvalidType, match="reservation_id"):
            spool.commit(forged)
        assert spool.commit(real).state.value == "ready"


def test_a_traversing_commit_opens_nothing_outside_the_spool(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.json").write_text("{}")
    before = os.stat(outside / "x.json").st_atime_ns
    with make_spool(tmp_path / "s") as spool:
        real = spool.prepare("k", {}, job_id="real")
        with pytest.raises(InvalidJob):
            spool.commit(Reservation(job_id="../../outside/x", reservation_id="r", job=real.job))
    assert os.stat(outside / "x.json").st_atime_ns == before  # not even read
    assert (outside / "x.json").read_text() == "{}"
