"""The fenced merge against a model: any sequence of upserts and deletes, in any batches.

Per key, the write with the highest (version, fence) wins, a later one on a tie (inside a
batch by deduplication, across batches by the merge's `>=`); the key is live when that
write is an upsert. Batches may start with deletes before the table exists
(tests/test_projection_deletes_first.py) and carry nulls.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from jobspool.projection.handler import make_delete, make_upsert
from jobspool.projection.lance import ProjectionStore

_op = st.tuples(
    st.sampled_from(["upsert", "delete"]),
    st.sampled_from(["a", "b", "c"]),  # the key
    st.integers(min_value=0, max_value=3),  # version
    st.integers(min_value=1, max_value=4),  # fence
    st.one_of(st.none(), st.text(max_size=3)),  # text
)
_batches = st.lists(st.lists(_op, min_size=1, max_size=5), min_size=1, max_size=4)


def _model(batches: list[list[tuple[str, str, int, int, str | None]]]) -> dict[str, Any]:
    best: dict[str, tuple[int, int, str, str | None]] = {}
    for batch in batches:
        for op, key, version, fence, text in batch:
            cur = best.get(key)
            if cur is None or (version, fence) >= cur[:2]:
                best[key] = (version, fence, op, text)
    return {k: {"id": k, "text": t, "version": float(v), "fence": f}
            for k, (v, f, op, t) in best.items() if op == "upsert"}


@given(batches=_batches)
def test_the_table_holds_per_key_the_highest_version_and_fence_written(
        batches: list[list[tuple[str, str, int, int, str | None]]]) -> None:
    with tempfile.TemporaryDirectory() as where:
        store = ProjectionStore(Path(where) / "db")
        n = 0
        for batch in batches:
            writes = []
            for op, key, version, fence, text in batch:
                n += 1
                if op == "upsert":
                    writes.append(make_upsert(f"j{n}", "notes", {"id": key, "text": text},
                                              float(version), fence))
                else:
                    writes.append(make_delete(f"j{n}", "notes", key, float(version), fence))
            result = store.apply(writes)
            assert result.ok, result
        rows = store.table("notes").to_arrow().to_pylist()
        got = {r["id"]: r for r in rows}
        assert got == _model(batches)
        assert store.table("notes").count() == len(got)
