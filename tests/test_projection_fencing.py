"""Version fencing inside the merge: stale, duplicated and late writes never make a table wrong."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from jobspool.errors import ProjectionError
from jobspool.projection.handler import LIVE_FILTER, make_delete, make_upsert
from jobspool.projection.lance import LanceProjection, ProjectionStore
from tests.s3server import projection_store_for
from tests.spools import make_spool


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ProjectionStore:
    """Every fencing rule holds on a local directory and on s3:// (SeaweedFS, tests/s3server.py)."""
    return projection_store_for(request, tmp_path, "fencing")  # type: ignore[no-any-return]


def upsert(
    store: ProjectionStore,
    job: str,
    row: dict[str, object],
    version: float | None,
    fence: int,
    table: str = "notes",
) -> int:
    result = store.apply([make_upsert(job, table, row, version, fence)])
    assert result.ok, result
    return result.tables[table]


def delete(
    store: ProjectionStore, job: str, key: str, version: float | None, fence: int, table: str = "notes"
) -> int:
    result = store.apply([make_delete(job, table, key, version, fence)])
    assert result.ok, result
    return result.tables[table]


def test_lower_version_after_higher_is_ignored(store: ProjectionStore) -> None:
    upsert(store, "j1", {"id": "a", "text": "new"}, 5.0, 10)
    assert upsert(store, "j2", {"id": "a", "text": "old"}, 4.0, 99) == 0
    assert store.table("notes").get("a") == {"id": "a", "text": "new", "version": 5.0, "fence": 10}


def test_lower_fence_at_equal_version_is_ignored(store: ProjectionStore) -> None:
    upsert(store, "j1", {"id": "a", "text": "second run"}, 5.0, 11)
    assert upsert(store, "j0", {"id": "a", "text": "first run"}, 5.0, 10) == 0
    assert store.table("notes").get("a")["text"] == "second run"  # type: ignore[index]


def test_higher_version_or_fence_replaces_the_row(store: ProjectionStore) -> None:
    upsert(store, "j1", {"id": "a", "text": "v1"}, 1.0, 10)
    assert upsert(store, "j2", {"id": "a", "text": "v2"}, 2.0, 3) == 1
    assert upsert(store, "j3", {"id": "a", "text": "v2 again, later run"}, 2.0, 4) == 1
    row = store.table("notes").get("a")
    assert row == {"id": "a", "text": "v2 again, later run", "version": 2.0, "fence": 4}


def test_equal_version_and_fence_is_an_idempotent_rewrite(store: ProjectionStore) -> None:
    upsert(store, "j1", {"id": "a", "text": "same"}, 3.0, 7)
    upsert(store, "j1", {"id": "a", "text": "same"}, 3.0, 7)
    proj = store.table("notes")
    assert proj.count() == 1
    assert proj.get("a") == {"id": "a", "text": "same", "version": 3.0, "fence": 7}
    assert proj.raw.count_rows() == 1  # type: ignore[union-attr]


def test_version_defaults_to_the_fence_token(store: ProjectionStore) -> None:
    upsert(store, "j1", {"id": "a", "text": "token 8"}, None, 8)
    assert upsert(store, "j0", {"id": "a", "text": "token 7"}, None, 7) == 0
    assert store.table("notes").get("a") == {"id": "a", "text": "token 8", "version": 8.0, "fence": 8}


def test_delete_hides_the_row_from_every_reader(store: ProjectionStore) -> None:
    upsert(store, "j1", {"id": "a", "text": "gone soon", "n": 1}, 1.0, 1)
    upsert(store, "j2", {"id": "b", "text": "stays", "n": 2}, 1.0, 2)
    assert delete(store, "j3", "a", 2.0, 3) == 1
    proj = store.table("notes")
    assert proj.get("a") is None
    assert proj.count() == 1
    assert proj.to_arrow().column("id").to_pylist() == ["b"]
    assert proj.search(where="n >= 0", limit=10).column("id").to_pylist() == ["b"]
    assert "_deleted" not in proj.to_arrow().column_names
    raw = proj.raw
    assert raw is not None
    assert raw.count_rows() == 2  # the tombstone is stored...
    assert raw.count_rows(LIVE_FILTER) == 1  # ...and the documented filter hides it


def test_stale_upsert_after_tombstone_does_not_resurrect(store: ProjectionStore) -> None:
    upsert(store, "j1", {"id": "a", "text": "v1"}, 1.0, 1)
    delete(store, "j2", "a", 2.0, 2)
    # A zombie run of an older version, even with a newer lease token.
    assert upsert(store, "j3", {"id": "a", "text": "v1 replayed"}, 1.0, 50) == 0
    assert store.table("notes").get("a") is None
    # A newer version of the source legitimately brings it back.
    upsert(store, "j4", {"id": "a", "text": "v3"}, 3.0, 51)
    assert store.table("notes").get("a") == {"id": "a", "text": "v3", "version": 3.0, "fence": 51}


def test_stale_delete_does_not_remove_a_newer_row(store: ProjectionStore) -> None:
    upsert(store, "j1", {"id": "a", "text": "v5"}, 5.0, 5)
    assert delete(store, "j0", "a", 4.0, 9) == 0
    assert store.table("notes").get("a") is not None


def test_delete_of_never_written_key_still_fences_later_stale_writes(
    store: ProjectionStore,
) -> None:
    upsert(store, "j0", {"id": "other", "text": "x"}, 1.0, 1)
    delete(store, "j1", "a", 5.0, 5)
    assert upsert(store, "j2", {"id": "a", "text": "late"}, 4.0, 6) == 0
    assert store.table("notes").get("a") is None


def test_a_batch_keeps_the_highest_version_per_key(store: ProjectionStore) -> None:
    writes = [
        make_upsert("j1", "notes", {"id": "a", "text": "v2"}, 2.0, 1),
        make_upsert("j2", "notes", {"id": "a", "text": "v1"}, 1.0, 9),
        make_delete("j3", "notes", "b", 1.0, 3),
        make_upsert("j4", "notes", {"id": "b", "text": "b v2"}, 2.0, 4),
        make_upsert("j5", "notes", {"id": "c", "text": "c"}, 1.0, 5),
        make_delete("j6", "notes", "c", 1.0, 6),
    ]
    result = store.apply(writes)
    assert result.ok
    proj = store.table("notes")
    assert proj.get("a")["text"] == "v2"  # type: ignore[index]
    assert proj.get("b")["text"] == "b v2"  # type: ignore[index]
    assert proj.get("c") is None
    assert proj.raw.count_rows() == 3  # type: ignore[union-attr]


def test_zombie_with_expired_lease_cannot_overwrite_newer_completion(
    tmp_path: Path, store: ProjectionStore
) -> None:
    from jobspool.errors import LeaseLost

    now = [1_700_000_000.0]
    spool = make_spool(tmp_path / "spool", clock=lambda: now[0], lease_seconds=30.0)
    request_close = spool.close
    try:
        _zombie_scenario(spool, store, now, LeaseLost)
    finally:
        request_close()


def _zombie_scenario(
    spool: Any, store: ProjectionStore, now: list[float], lease_lost: type[Exception]
) -> None:
    spool.enqueue("note", {"id": "a"}, job_id="job-a")
    [zombie] = spool.claim(owner="zombie")
    now[0] += 31.0  # the zombie pauses past its lease
    [fresh] = spool.claim(owner="fresh")
    assert fresh.token > zombie.token

    # The fresh run read source revision 2 and completes.
    assert upsert(store, fresh.job_id, {"id": "a", "text": "rev 2"}, 2.0, fresh.token) == 1
    spool.complete(fresh)

    # The zombie wakes with its older snapshot (revision 1), or without a
    # version (its token stands in): neither can overwrite the row.
    assert upsert(store, zombie.job_id, {"id": "a", "text": "rev 1"}, 1.0, zombie.token) == 0
    assert upsert(store, zombie.job_id, {"id": "a", "text": "rev ?"}, None, zombie.token) == 0
    with pytest.raises(lease_lost):
        spool.complete(zombie)
    assert store.table("notes").get("a") == {"id": "a", "text": "rev 2", "version": 2.0, "fence": fresh.token}


def test_an_integer_version_too_large_to_order_exactly_is_refused(tmp_path: Path) -> None:
    """Versions are stored as float64: 2**53 and 2**53 + 1 would be one value, and the
    stale write would win on its fence. Refused, naming the field and what to use."""
    from jobspool.errors import ProjectionError

    store = ProjectionStore(tmp_path / "db")
    with pytest.raises(ProjectionError, match=r"version.*too large.*2\*\*53"):
        make_upsert("j1", "notes", {"id": "a"}, 2**53 + 1, 5)
    with pytest.raises(ProjectionError, match="too large"):
        make_delete("j1", "notes", "a", -(2**53) - 1, 5)
    upsert(store, "j1", {"id": "a", "text": "exact"}, 2**53, 5)
    assert upsert(store, "j2", {"id": "a", "text": "older"}, 2**53 - 1, 9) == 0
    assert store.table("notes").get("a")["text"] == "exact"  # type: ignore[index]


def test_a_numpy_integer_version_orders_like_an_int(tmp_path: Path) -> None:
    """numpy's integers (a stat array's mtimes) were refused ("must be a number") while
    numpy's floats passed; they order exactly like the ints they hold, bools stay refused."""
    import numpy as np

    from jobspool.errors import ProjectionError

    store = ProjectionStore(tmp_path / "db")
    upsert(store, "j1", {"id": "a", "text": "new"}, np.int64(7), 5)
    assert upsert(store, "j2", {"id": "a", "text": "old"}, np.int32(6), 9) == 0
    assert store.table("notes").get("a") == {"id": "a", "text": "new", "version": 7.0,
                                             "fence": 5}
    with pytest.raises(ProjectionError, match="too large"):
        make_upsert("j3", "notes", {"id": "a"}, np.int64(2**53 + 1), 5)
    with pytest.raises(ProjectionError, match="must be a number"):
        make_upsert("j3", "notes", {"id": "a"}, np.bool_(True), 5)


def test_numpy_vectors_make_a_searchable_column_and_empty_lists_a_usable_one(
        tmp_path: Path) -> None:
    """A first write with numpy vectors made a list<double> column (no vector search:
    "There is no vector column"), and an empty list first made list<null>, refusing every
    later item. Now: fixed-size float32 lists as from Python lists, and lists of text."""
    import lancedb
    import numpy as np
    import pyarrow as pa

    store = ProjectionStore(tmp_path / "db")
    upsert(store, "j1", {"id": "a", "vector": np.array([0.1, 0.2]), "tags": []}, 1, 1, "v")
    upsert(store, "j2", {"id": "b", "vector": np.array([0.9, 0.8]), "tags": ["x"]}, 1, 2, "v")
    table = lancedb.connect(str(tmp_path / "db")).open_table("v")
    assert table.schema.field("vector").type == pa.list_(pa.float32(), 2)
    assert table.schema.field("tags").type == pa.list_(pa.string())
    assert table.search([0.9, 0.8]).limit(1).to_list()[0]["id"] == "b"
    assert store.table("v").get("b")["tags"] == ["x"]  # type: ignore[index]


@pytest.mark.parametrize(("first", "later"), [
    ([[]], [["a", "b"]]),
    ({"a": None}, {"a": "x"}),
    ([{"a": None}], [{"a": "y"}]),
    ([[[]]], [[["z"]]]),
])
def test_nulls_nested_in_a_first_value_make_text_a_later_value_fits(
        tmp_path: Path, first: Any, later: Any) -> None:
    # Found probing the projection: `[[]]` made list<list<null>>, refusing every later value
    # for good ("Unsupported cast from string to null"), as `[]` had before.
    proj = LanceProjection(tmp_path / "db", "t")
    proj.upsert({"id": "a", "m": first}, version=1)
    proj.upsert({"id": "b", "m": later}, version=1)
    assert proj.get("b")["m"] == later  # type: ignore[index]


def test_a_first_value_holding_an_empty_object_is_refused_saying_so(tmp_path: Path) -> None:
    # `{"meta": {}}` made a struct<> column no later object fitted.
    proj = LanceProjection(tmp_path / "db", "t")
    with pytest.raises(ProjectionError, match="holds an empty object"):
        proj.upsert({"id": "a", "meta": {}}, version=1)
    proj.upsert({"id": "b", "meta": {"author": "x"}}, version=1)
    assert proj.get("b")["meta"] == {"author": "x"}  # type: ignore[index]


def test_a_datetime_whose_zone_does_not_match_its_column_fails_its_own_job(
        tmp_path: Path) -> None:
    """A naive datetime written into a zone-aware column was taken as UTC (12:00 read back
    as 17:00+05:00), an aware one into a naive column lost its zone: both silently. Now
    refused naming the field; aware values in any zone still land in an aware column."""
    from datetime import datetime, timedelta, timezone

    from jobspool.errors import ProjectionError

    plus5 = timezone(timedelta(hours=5))
    store = ProjectionStore(tmp_path / "db")
    upsert(store, "j1", {"id": "a", "at": datetime(2024, 1, 1, 12, tzinfo=plus5)}, 1, 1, "tz")
    upsert(store, "j2", {"id": "n", "at": datetime(2024, 1, 1, 12)}, 1, 2, "naive")
    for table, value in (("tz", datetime(2024, 1, 1, 12)),
                         ("naive", datetime(2024, 1, 1, 12, tzinfo=plus5))):
        result = store.apply([make_upsert("j3", table, {"id": "b", "at": value}, 1, 3)])
        assert isinstance(result.rejected.get("j3"), ProjectionError), result
        assert "'at'" in str(result.rejected["j3"])
    upsert(store, "j4", {"id": "c", "at": datetime(2024, 1, 1, 7, tzinfo=UTC)},
           1, 4, "tz")
    got = store.table("tz").get("c")["at"]  # type: ignore[index]
    assert got == datetime(2024, 1, 1, 12, tzinfo=plus5)  # the same instant


def test_a_column_null_in_the_first_write_takes_later_text_and_refuses_other_types(
        tmp_path: Path) -> None:
    """A field still empty when its table is created (a note not yet written) becomes a
    nullable string column: later text lands. It used to be left out of the table, and
    every later value for it was refused as not in the schema."""
    store = ProjectionStore(tmp_path / "db")
    upsert(store, "j1", {"id": "a", "text": None}, 1.0, 1)
    upsert(store, "j2", {"id": "b", "text": "now a string"}, 1.0, 2)
    assert store.table("notes").get("b")["text"] == "now a string"  # type: ignore[index]
    assert store.table("notes").get("a")["text"] is None  # type: ignore[index]
    result = store.apply([make_upsert("j3", "notes", {"id": "c", "text": 5}, 1.0, 3)])
    assert not result.ok and "text" in str(result)


def test_an_empty_vector_in_every_row_of_the_first_write_is_left_out_with_its_column(
        tmp_path: Path) -> None:
    """README: a vector column null or empty in every row of the first write is left out.
    `[]` failed the job, saying the field was not in a table that did not exist yet."""
    import numpy as np

    store = ProjectionStore(tmp_path / "db")
    result = store.apply([make_upsert("j1", "docs", {"id": "a", "embedding": []}, 1.0, 1),
                          make_upsert("j2", "docs", {"id": "b", "embedding": np.zeros(0)},
                                      1.0, 2),
                          make_upsert("j3", "docs", {"id": "c", "embedding": None}, 1.0, 3)])
    assert result.ok, result
    assert store.table("docs").count() == 3
    assert "embedding" not in store.table("docs").raw.schema.names


@pytest.mark.parametrize(("bad", "good"), [(1j, "fine"), (2**64, 5), ("\udc80", "ok"),
                                          ([1, "a"], [1, 2]), ({1: "x"}, {"a": "b"})],
                         ids=["complex", "int-past-64-bits", "lone-surrogate", "mixed-list",
                              "int-keys"])
def test_one_jobs_unstorable_value_in_a_new_table_fails_that_job_alone(
        tmp_path: Path, bad: object, good: object) -> None:
    # Found in a projection probe: the bad value, first in the batch, dropped its column
    # from the new table, and the good job writing that column was dead-lettered with it.
    store = ProjectionStore(tmp_path / "db")
    result = store.apply([make_upsert("bad", "t", {"id": "a", "v": bad}, 1.0, 1),
                          make_upsert("good", "t", {"id": "b", "v": good}, 1.0, 2)])
    assert set(result.rejected) == {"bad"} and not result.failed, result
    assert "'v'" in str(result.rejected["bad"])
    assert store.table("t").get("b")["v"] == good  # type: ignore[index]


def test_a_table_not_made_by_jobspool_dead_letters_its_writers_saying_why(
        tmp_path: Path) -> None:
    """A table made by hand (no fencing columns) or keyed on a non-string column cannot
    take fenced writes: no retry can fix that, so the job is rejected (dead-lettered)
    naming the problem, not retried with LanceDB's error until its attempts run out."""
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(str(tmp_path / "db"))
    db.create_table("plain", pa.table({"id": ["a"], "text": ["x"]}))
    db.create_table("intkey", pa.table({"id": pa.array([1], pa.int64()), "version": [1.0]}))
    store = ProjectionStore(tmp_path / "db")
    for table, says in (("plain", "no 'version' column"), ("intkey", "no 'fence' column")):
        result = store.apply([make_upsert("j1", table, {"id": "b", "text": "y"}, 1.0, 1)])
        assert "j1" in result.rejected and not result.failed, result
        assert says in str(result.rejected["j1"]) and "another table" in str(result.rejected["j1"])


def test_a_reader_finds_the_key_a_table_was_made_with(tmp_path: Path) -> None:
    """A table keyed on `path` (App(keys=...)) is read without repeating `key=`: the
    table's schema records its key (reading it with the default `id` failed)."""
    from jobspool.projection.lance import LanceProjection

    writer = ProjectionStore(tmp_path / "db", keys={"docs": "path"})
    writer.apply([make_upsert("j1", "docs", {"path": "/a.md", "text": "x"}, 1.0, 1, key="path")])
    reader = LanceProjection(tmp_path / "db", "docs")
    assert reader.key == "path"
    assert reader.get("/a.md")["text"] == "x"  # type: ignore[index]
    assert LanceProjection(tmp_path / "db", "missing").key == "id"


def test_a_column_declared_not_null_refuses_live_rows_without_it(tmp_path: Path) -> None:
    # Found in a projection probe: the declaration was dropped (the column is stored
    # nullable, for tombstones) and rows without it were stored with null, silently.
    import pyarrow as pa

    declared = pa.schema([pa.field("id", pa.string(), nullable=False),
                          pa.field("n", pa.int64(), nullable=False),
                          pa.field("note", pa.string())])
    store = ProjectionStore(tmp_path / "db", schemas={"t": declared})
    assert store.apply([make_upsert("ok", "t", {"id": "a", "n": 1}, 1.0, 1)]).ok
    later = ProjectionStore(tmp_path / "db")  # another process: the table says it
    for writer in (store, later):
        result = writer.apply([make_upsert("missing", "t", {"id": "b", "note": "x"}, 1.0, 2),
                               make_upsert("null", "t", {"id": "c", "n": None}, 1.0, 3),
                               make_upsert("fine", "t", {"id": "d", "n": 4}, 1.0, 4),
                               make_delete("gone", "t", "a", 2.0, 5)])
        assert set(result.rejected) == {"missing", "null"}, result
        assert "declared not null" in str(result.rejected["missing"])
    assert store.table("t").get("d") == {"id": "d", "n": 4, "note": None, "version": 1.0,
                                         "fence": 4}
    assert store.table("t").get("a") is None and store.table("t").get("b") is None
