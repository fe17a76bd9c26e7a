"""DESIGN §2: a job file is type-checked when read, "a lease of the right shape" included.
A leased job whose lease has a negative token or an empty owner (no claim writes either)
was read as a valid job; it is unreadable now, as every other out-of-range field is."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobspool import Spool
from jobspool.errors import CorruptFileWarning, UnreadableJob


@pytest.mark.parametrize(("field", "value"), [("token", -1), ("owner", "")])
def test_a_lease_of_the_wrong_shape_is_unreadable(tmp_path: Path, field: str,
                                                  value: object) -> None:
    root = tmp_path / "s"
    with Spool(root, durable=False) as spool:
        spool.enqueue("k", {}, job_id="j1")
        spool.claim(kinds="k", lease_seconds=60)
        path = root / "leased" / "j1.json"
        doc = orjson.loads(path.read_bytes())
        doc["lease"][field] = value
        path.write_bytes(orjson.dumps(doc))
        with pytest.warns(CorruptFileWarning), pytest.raises(UnreadableJob):
            spool.get("j1")
        assert spool.fsck().ok is False
