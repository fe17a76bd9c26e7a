"""ProjectionStore.apply: one merge per table per batch, per-job rejection, outcome-unknown failures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import jobspool.projection.lance as lance_mod
from jobspool.errors import ProjectionError
from jobspool.projection.handler import PendingWrite, make_delete, make_upsert
from jobspool.projection.lance import LanceProjection, ProjectionStore

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path: Path) -> ProjectionStore:
    return ProjectionStore(tmp_path / "db")


def seed(store: ProjectionStore, table: str = "notes") -> int:
    result = store.apply([make_upsert("seed", table, {"id": "seed", "text": "s", "n": 0}, 1.0, 1)])
    assert result.ok
    return store.table(table).version()  # type: ignore[return-value]


# --- group commit


def test_a_batch_of_many_jobs_makes_exactly_one_table_version(store: ProjectionStore) -> None:
    before = seed(store)
    writes = [
        make_upsert(f"job-{i}", "notes", {"id": f"doc-{i}", "text": f"t{i}", "n": i}, None, 10 + i)
        for i in range(40)
    ]
    writes += [make_delete("job-del", "notes", ["seed"], None, 60)]
    result = store.apply(writes)
    assert result.ok
    assert result.tables == {"notes": 41}
    proj = store.table("notes")
    assert proj.version() == before + 1
    assert proj.count() == 40
    assert len(proj.raw.list_versions()) == before + 1  # type: ignore[union-attr]


def test_one_merge_per_table_per_batch(store: ProjectionStore, monkeypatch: Any) -> None:
    seed(store, "a")
    seed(store, "b")
    calls: list[tuple[str, int]] = []
    real = lance_mod._execute_merge

    def counting(tbl: Any, key: str, batch: pa.Table, timeout: Any) -> Any:
        calls.append((tbl.name, batch.num_rows))
        return real(tbl, key, batch, timeout)

    monkeypatch.setattr(lance_mod, "_execute_merge", counting)
    writes = [make_upsert(f"j{i}", "ab"[i % 2], {"id": f"k{i}", "n": i}, None, 5 + i) for i in range(10)]
    assert store.apply(writes).ok
    assert sorted(calls) == [("a", 5), ("b", 5)]


def test_apply_of_nothing_commits_nothing(store: ProjectionStore) -> None:
    before = seed(store)
    assert store.apply([]).tables == {}
    assert store.table("notes").version() == before


# --- bad rows are split out per job


def test_bad_jobs_are_rejected_and_the_good_rows_still_apply(store: ProjectionStore) -> None:
    seed(store)
    writes = [
        make_upsert("good-1", "notes", {"id": "g1", "text": "ok", "n": 1}, None, 10),
        make_upsert("wrong-type", "notes", {"id": "b1", "n": "not a number"}, None, 11),
        make_upsert("unknown-field", "notes", {"id": "b2", "colour": "red"}, None, 12),
        make_upsert("lossy", "notes", {"id": "b3", "n": 1.5}, None, 13),
        PendingWrite("no-key", "notes", "upsert", ({"text": "keyless"},), (), 14.0, 14),
        PendingWrite("int-key", "notes", "upsert", ({"id": 7, "text": "x"},), (), 15.0, 15),
        make_upsert("good-2", "notes", {"id": "g2", "text": "ok", "n": 2.0}, None, 16),
    ]
    result = store.apply(writes)
    assert result.failed == {}
    assert set(result.rejected) == {"wrong-type", "unknown-field", "lossy", "no-key", "int-key"}
    assert result.rejected["wrong-type"].field == "n"
    assert result.rejected["unknown-field"].field == "colour"
    assert result.rejected["lossy"].field == "n"
    assert result.rejected["no-key"].field == "id"
    assert result.rejected["int-key"].field == "id"
    for err in result.rejected.values():
        assert "\n" not in str(err)
        assert isinstance(err, ProjectionError)
    assert result.tables == {"notes": 2}
    proj = store.table("notes")
    assert sorted(proj.to_arrow().column("id").to_pylist()) == ["g1", "g2", "seed"]
    assert proj.get("g2")["n"] == 2  # type: ignore[index]


def test_a_rejected_job_writes_nothing_in_any_table(store: ProjectionStore) -> None:
    seed(store, "a")
    seed(store, "b")
    writes = [
        make_upsert("mixed", "a", {"id": "x", "n": 1}, None, 10),
        make_upsert("mixed", "b", {"id": "x", "n": "bad"}, None, 10),
        make_upsert("fine", "a", {"id": "y", "n": 2}, None, 11),
    ]
    result = store.apply(writes)
    assert set(result.rejected) == {"mixed"}
    assert store.table("a").get("x") is None
    assert store.table("a").get("y") is not None


def test_a_rejected_job_does_not_shadow_a_good_row_for_the_same_key(
    store: ProjectionStore,
) -> None:
    seed(store)
    writes = [
        make_upsert("good", "notes", {"id": "k", "n": 1}, 1.0, 10),
        make_upsert("bad", "notes", {"id": "k", "n": "x"}, 9.0, 11),
    ]
    result = store.apply(writes)
    assert set(result.rejected) == {"bad"}
    assert store.table("notes").get("k")["n"] == 1  # type: ignore[index]


def test_make_upsert_refuses_malformed_writes_with_one_line_naming_the_field() -> None:
    cases: list[tuple[Any, str]] = [
        (lambda: make_upsert("j", "t", {"text": "no key"}, None, 1), "id"),
        (lambda: make_upsert("j", "t", {"id": 3}, None, 1), "id"),
        (lambda: make_upsert("j", "t", {"id": "a", "version": 2}, None, 1), "version"),
        (lambda: make_upsert("j", "t", {"id": "a", "_deleted": True}, None, 1), "_deleted"),
        (lambda: make_upsert("j", "t", {"id": "a"}, float("nan"), 1), "version"),
        (lambda: make_upsert("j", "t", {"id": "a"}, "7", 1), "version"),
        (lambda: make_upsert("j", "t", {"id": "a"}, None, -1), "fence"),
        (lambda: make_upsert("j", "t", "not rows", None, 1), None),
        (lambda: make_upsert("j", "../x", {"id": "a"}, None, 1), None),
        (lambda: make_delete("j", "t", [1], None, 1), "id"),
    ]
    for build, field in cases:
        with pytest.raises(ProjectionError) as info:
            build()
        assert "\n" not in str(info.value)
        if field is not None:
            assert info.value.field == field
            assert repr(field) in str(info.value)


def test_make_upsert_defaults_version_to_the_fence_and_copies_rows() -> None:
    row = {"id": "a", "text": "x"}
    w = make_upsert("j", "t", [row], None, 42)
    row["text"] = "mutated after the call"
    assert w.version == 42.0 and w.fence == 42
    assert w.rows == ({"id": "a", "text": "x"},)


# --- failures: outcome unknown, retryable


def test_a_failed_commit_fails_that_tables_jobs_only(store: ProjectionStore, monkeypatch: Any) -> None:
    seed(store, "a")
    seed(store, "b")
    real = lance_mod._execute_merge

    def flaky(tbl: Any, key: str, batch: pa.Table, timeout: Any) -> Any:
        if tbl.name == "b":
            raise RuntimeError("LanceError(IO): injected")
        return real(tbl, key, batch, timeout)

    monkeypatch.setattr(lance_mod, "_execute_merge", flaky)
    before_b = store.table("b").version()
    result = store.apply(
        [
            make_upsert("ja", "a", {"id": "x", "n": 1}, None, 10),
            make_upsert("jb", "b", {"id": "x", "n": 1}, None, 11),
            make_upsert("jab", "a", {"id": "y", "n": 1}, None, 12),
            make_upsert("jab", "b", {"id": "y", "n": 1}, None, 12),
        ]
    )
    assert set(result.failed) == {"jb", "jab"}
    assert result.rejected == {}
    assert result.tables == {"a": 2}
    assert store.table("b").version() == before_b
    # The retry, once the table is healthy, converges (the merge is idempotent).
    monkeypatch.setattr(lance_mod, "_execute_merge", real)
    again = store.apply(
        [
            make_upsert("jab", "a", {"id": "y", "n": 1}, None, 12),
            make_upsert("jab", "b", {"id": "y", "n": 1}, None, 12),
        ]
    )
    assert again.ok
    assert store.table("a").count() == 3 and store.table("b").count() == 2


def test_an_error_opening_a_table_fails_its_jobs(store: ProjectionStore, monkeypatch: Any) -> None:
    def broken(conn: Any, name: str) -> Any:
        raise RuntimeError("object store unreachable")

    store.connection  # noqa: B018  # the database exists (a missing one has nothing to open)
    monkeypatch.setattr(lance_mod, "_open_table", broken)
    result = store.apply([make_upsert("j", "notes", {"id": "x"}, None, 1)])
    assert set(result.failed) == {"j"} and result.tables == {}


# --- tables and schemas


def test_a_new_table_has_a_non_nullable_primary_key_and_reserved_columns(
    store: ProjectionStore,
) -> None:
    assert store.apply([make_upsert("j", "notes", {"id": "a", "text": "x", "n": 1}, 2.5, 3)]).ok
    schema = store.table("notes").raw.schema  # type: ignore[union-attr]
    key = schema.field("id")
    assert not key.nullable
    assert key.metadata[b"lance-schema:unenforced-primary-key:position"] == b"1"
    assert schema.field("text").nullable and schema.field("n").type == pa.int64()
    assert schema.field("version").type == pa.float64()
    assert schema.field("fence").type == pa.int64()
    assert schema.field("_deleted").type == pa.bool_()


def test_a_declared_schema_is_used_and_allows_deletes_before_any_upsert(tmp_path: Path) -> None:
    declared = pa.schema(
        [
            pa.field("id", pa.string()),
            pa.field("score", pa.float32()),
            pa.field("vector", pa.list_(pa.float32(), 2)),
        ]
    )
    store = ProjectionStore(tmp_path / "db", schemas={"docs": declared})
    assert store.apply([make_delete("d", "docs", "early", 5.0, 5)]).ok
    assert store.apply([make_upsert("u", "docs", {"id": "early", "score": 1}, 4.0, 4)]).tables == {"docs": 0}
    assert store.apply(
        [
            make_upsert("v1", "docs", {"id": "p", "score": 0.5, "vector": [0.0, 1.0]}, 1.0, 6),
            make_upsert("v2", "docs", {"id": "q", "score": 0.7, "vector": [1.0, 0.0]}, 1.0, 7),
        ]
    ).ok
    proj = store.table("docs")
    assert proj.raw.schema.field("score").type == pa.float32()  # type: ignore[union-attr]
    hits = proj.search([0.9, 0.1], limit=5)
    assert hits.column("id").to_pylist() == ["q", "p"]


def test_deletes_for_an_unknown_table_make_it_to_hold_their_tombstones(
        store: ProjectionStore) -> None:
    """(Until 12-05 a no-op: a late, older upsert of the key then created the row;
    tests/test_projection_deletes_first.py.) Readers see an empty table."""
    result = store.apply([make_delete("d", "nowhere", "a", None, 1)])
    assert result.ok and result.tables == {"nowhere": 1}
    assert store.table("nowhere").version() is not None
    assert store.table("nowhere").get("a") is None
    assert store.table("nowhere").count() == 0


def test_lance_projection_reads_by_uri_and_writes_directly(tmp_path: Path) -> None:
    proj = LanceProjection(tmp_path / "db", "notes")
    assert proj.to_arrow().num_rows == 0 and proj.count() == 0
    assert proj.upsert([{"id": "a", "text": "it's"}, {"id": "b", "text": "b"}], version=1) == 2
    proj.delete("b", version=2)
    assert proj.get("a") == {"id": "a", "text": "it's", "version": 1.0, "fence": 0}
    assert proj.get("it's") is None
    with pytest.raises(ProjectionError):
        proj.upsert({"id": "c", "text": 3}, version=3)
    reader = LanceProjection(tmp_path / "db", "notes")
    assert reader.to_arrow(columns=["id"]).to_pylist() == [{"id": "a"}]


def test_handler_module_imports_without_lancedb_or_pyarrow() -> None:
    code = (
        "import sys\n"
        "import jobspool.projection as p\n"
        "from jobspool.projection.handler import make_upsert\n"
        "make_upsert('j', 't', {'id': 'a'}, None, 1)\n"
        "assert p.LIVE_FILTER\n"
        "bad = [m for m in ('lancedb', 'pyarrow') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        check=True,
    )
    assert out.stdout.strip() == ""


def test_a_vector_with_nan_or_the_wrong_length_is_rejected(tmp_path: Path) -> None:
    declared = pa.schema([pa.field("id", pa.string()), pa.field("vector", pa.list_(pa.float32(), 2))])
    store = ProjectionStore(tmp_path / "db", schemas={"docs": declared})
    result = store.apply(
        [
            make_upsert("nan", "docs", {"id": "a", "vector": [float("nan"), 1.0]}, None, 1),
            make_upsert("short", "docs", {"id": "b", "vector": [1.0]}, None, 2),
            make_upsert("ok", "docs", {"id": "c", "vector": [1.0, 2.0]}, None, 3),
            # a hole was stored and ranked as if it were 0; an infinity as a distance of inf
            make_upsert("hole", "docs", {"id": "d", "vector": [1.0, None]}, None, 4),
            make_upsert("inf", "docs", {"id": "e", "vector": [float("inf"), 1.0]}, None, 5),
        ]
    )
    assert set(result.rejected) == {"nan", "short", "hole", "inf"}
    assert result.rejected["nan"].field == "vector"
    assert "None" in str(result.rejected["hole"]) and "infinity" in str(result.rejected["inf"])
    assert store.table("docs").to_arrow(columns=["id"]).to_pylist() == [{"id": "c"}]


def test_an_upsert_of_no_rows_commits_nothing(store: ProjectionStore) -> None:
    before = seed(store)
    result = store.apply([make_upsert("empty", "notes", [], None, 5)])
    assert result.ok and result.tables == {"notes": 0}
    assert store.table("notes").version() == before


def test_a_not_null_column_added_by_hand_is_refused_at_planning(tmp_path: Path) -> None:
    # `add_columns({"extra": "'x'"})` makes a NOT NULL column: every merge after it failed
    # at LanceDB ("declared as non-nullable but contains null values"), retried four times
    # per job, then dead-lettered with Arrow's message.
    store = ProjectionStore(tmp_path / "db")
    assert store.apply([make_upsert("j1", "t", {"id": "a", "n": 1}, None, 1)]).ok
    store.connection.open_table("t").add_columns({"extra": "'x'"})
    result = ProjectionStore(tmp_path / "db").apply(
        [make_upsert("j2", "t", {"id": "b", "n": 2}, None, 2)])
    assert set(result.rejected) == {"j2"} and not result.failed
    assert "'extra' is NOT NULL" in str(result.rejected["j2"])


def test_a_table_deleted_under_a_store_is_made_anew_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import shutil

    store = ProjectionStore(tmp_path / "db")
    assert store.apply([make_upsert("j1", "t", {"id": "a", "n": 1}, None, 1)]).ok
    shutil.rmtree(tmp_path / "db" / "t.lance")  # an operator's slip
    caplog.set_level(logging.WARNING, logger="jobspool")
    for attempt in range(3):  # the cached handle fails once, then the table is made anew
        if store.apply([make_upsert("j2", "t", {"id": "b", "n": 2}, None, 2)]).ok:
            break
    assert attempt <= 1
    assert any("was there and is gone" in r.getMessage() for r in caplog.records)


def test_a_column_declared_after_the_table_was_made_is_refused_saying_how_to_add_it(
        tmp_path: Path) -> None:
    # Found by a projection probe: declared in schemas=, the column was refused as "not in
    # the schema of table 't'", read as a bug; the README said "declare it in schemas=".
    import lancedb

    from jobspool import Spool, Worker

    uri = str(tmp_path / "index")

    def write(job: Any, ctx: Any) -> None:
        ctx.upsert("t", job.payload)

    declared = pa.schema([pa.field("id", pa.string(), nullable=False),
                          pa.field("x", pa.int64()), pa.field("y", pa.string())])
    with Spool(tmp_path / "spool") as spool:
        spool.enqueue("k", {"id": "a", "x": 1})
        assert Worker(spool, {"k": write}, projection=uri).run_until_idle().completed == 1
        spool.enqueue("k", {"id": "b", "x": 2, "y": "new"}, job_id="late")
        store = ProjectionStore(uri, schemas={"t": declared})
        assert Worker(spool, {"k": write}, projection=store).run_until_idle().dead_lettered == 1
        error = spool.get("late").last_error or ""
        assert "declared in schemas= but table 't' was made before it" in error
        assert "add_columns" in error
        # The fix it names works: the column added once, the job requeued completes.
        lancedb.connect(uri).open_table("t").add_columns(
            pa.schema([pa.field("y", pa.string())]))
        spool.requeue("late")
        store = ProjectionStore(uri, schemas={"t": declared})
        assert Worker(spool, {"k": write}, projection=store).run_until_idle().completed == 1
    assert LanceProjection(uri, "t").get("b")["y"] == "new"
