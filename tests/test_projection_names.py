"""Rows a handler writes: a column name LanceDB refuses fails that job alone, at the
`ctx.upsert` call, and a row is taken as it was at the call.

Before: a name with a dot, a backtick or NUL, or one of LanceDB's reserved columns
(`_rowid`...) passed the checks and failed at the merge, as "commit outcome unknown",
every job of the batch writing that table (6 of 6 dead-lettered for one bad row); a
backtick column even made the table refuse every later merge. And rows kept references to
the handler's lists and arrays until the batch committed: a buffer refilled in a loop wrote
its last value into every row.
"""

from __future__ import annotations

from pathlib import Path

import lancedb
import numpy as np
import pytest

from jobspool import App, JobState, Worker
from jobspool.errors import ProjectionError
from jobspool.projection.handler import make_upsert
from tests.spools import make_spool


@pytest.mark.parametrize("name", ["a.b", "`q`", "a\x00b", "_rowid", "_row_last_updated_at_version",
                                  "a\ud800"])
def test_a_name_lancedb_refuses_fails_its_own_job_only(tmp_path: Path, name: str) -> None:
    root, index = tmp_path / "spool", tmp_path / "index"

    def handler(job, ctx):  # type: ignore[no-untyped-def]
        row = {"id": job.id, "title": "t"}
        if job.payload.get("bad"):
            row[name] = 1
        ctx.upsert("docs", row)

    with make_spool(root) as spool:
        spool.enqueue("h", {"bad": True}, job_id="bad")
        for i in range(5):
            spool.enqueue("h", {}, job_id=f"good{i}")
        Worker(spool, App(handlers={"h": handler}, projection=str(index))).run_until_idle()
        bad = spool.get("bad")
        assert bad.state is JobState.DEAD_LETTER
        assert repr(name) in (bad.last_error or "")
        assert {spool.get(f"good{i}").state for i in range(5)} == {JobState.COMPLETED}
    table = lancedb.connect(str(index)).open_table("docs")
    assert table.count_rows() == 5
    with make_spool(root) as spool:  # the table still takes later writes
        spool.enqueue("h", {}, job_id="later")
        Worker(spool, App(handlers={"h": handler}, projection=str(index))).run_until_idle()
        assert spool.get("later").state is JobState.COMPLETED
    assert lancedb.connect(str(index)).open_table("docs").count_rows() == 6


def test_a_name_lancedb_refuses_is_refused_at_the_call_naming_it() -> None:
    with pytest.raises(ProjectionError) as caught:
        make_upsert("j1", "docs", {"id": "a", "a.b": 1}, None, 1)
    assert "'a.b'" in str(caught.value) and "\n" not in str(caught.value)


def test_a_row_is_taken_as_it_was_at_the_call() -> None:
    buf = np.zeros(3, dtype=np.float32)
    tags: list[str] = []
    meta: dict[str, list[int]] = {"seen": []}
    writes = []
    for i in range(3):
        buf[:] = i
        tags.append(f"t{i}")
        meta["seen"].append(i)
        writes.append(make_upsert("j1", "t", {"id": f"k{i}", "vector": buf, "tags": tags,
                                              "meta": meta}, None, 1))
    rows = [w.rows[0] for w in writes]
    assert [list(r["vector"]) for r in rows] == [[0.0] * 3, [1.0] * 3, [2.0] * 3]
    assert [r["tags"] for r in rows] == [["t0"], ["t0", "t1"], ["t0", "t1", "t2"]]
    assert [r["meta"]["seen"] for r in rows] == [[0], [0, 1], [0, 1, 2]]


@pytest.mark.parametrize(("options", "named"), [
    ({"keys": "path"}, "'path'"), ({"keys": [("t", "path")]}, "[('t', 'path')]"),
    ({"keys": {"../t": "path"}}, "'../t'"), ({"replay": {"h": 5}}, "replay hook")])
def test_an_app_built_wrong_says_what_in_one_line(options: dict[str, object],
                                                  named: str) -> None:
    from jobspool.errors import AppError

    with pytest.raises(AppError) as caught:
        App(handlers={"h": lambda job, ctx: None}, **options)  # type: ignore[arg-type]
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_reading_a_projection_that_is_not_there_creates_nothing(tmp_path: Path) -> None:
    """A reader with a mistyped path made an empty database there."""
    from jobspool.projection import LanceProjection, ProjectionStore

    where = tmp_path / "typo"
    table = LanceProjection(where, "docs")
    assert (table.get("a"), table.count(), table.raw) == (None, 0, None)
    assert ProjectionStore(where).table_names() == []
    assert not where.exists()


def test_a_numpy_float32_version_is_a_number_like_the_others() -> None:
    """np.float32 was refused ("must be a number") while numpy ints and float64 passed."""
    write = make_upsert("j1", "t", {"id": "a"}, np.float32(3.5), 1)
    assert write.version == 3.5
    with pytest.raises(ProjectionError):
        make_upsert("j1", "t", {"id": "a"}, np.float32("nan"), 1)


def test_a_table_name_lancedb_refuses_is_a_projection_error() -> None:
    from jobspool.projection import LanceProjection

    with pytest.raises(ProjectionError) as caught:
        LanceProjection("memory://", "é")
    assert "'é'" in str(caught.value)


def test_a_decimal_column_takes_larger_values_of_its_scale(tmp_path: Path) -> None:
    """Decimal("1.10") first made decimal128(3, 2): 10.50 and 123.45 were refused for good."""
    from decimal import Decimal

    from jobspool.projection import ProjectionStore

    store = ProjectionStore(tmp_path / "db")
    assert store.apply([make_upsert("j1", "prices", {"id": "a", "price": Decimal("1.10")},
                                    None, 1)]).ok
    later = store.apply([make_upsert("j2", "prices", {"id": "b", "price": Decimal("123.45")},
                                     None, 2)])
    assert later.ok, later
    assert store.table("prices").get("b")["price"] == Decimal("123.45")  # type: ignore[index]


@pytest.mark.parametrize("write", ["upsert", "delete"])
def test_a_key_with_a_lone_surrogate_fails_its_own_job_only(tmp_path: Path, write: str) -> None:
    """A key that cannot be written as UTF-8 failed the merge of every job in the batch
    (4 of 4 dead-lettered for one bad key), a UnicodeEncodeError naming no field."""
    root, index = tmp_path / "spool", tmp_path / "index"

    def handler(job, ctx):  # type: ignore[no-untyped-def]
        if not job.payload.get("bad"):
            ctx.upsert("docs", {"id": job.id, "title": "t"})
        elif write == "upsert":
            ctx.upsert("docs", {"id": "x\udc80", "title": "t"})
        else:
            ctx.delete("docs", ["x\udc80"])

    with make_spool(root) as spool:
        for i in range(3):
            spool.enqueue("h", {}, job_id=f"good{i}")
        spool.enqueue("h", {"bad": True}, job_id="bad")
        Worker(spool, App(handlers={"h": handler}, projection=str(index))).run_until_idle()
        bad = spool.get("bad")
        assert bad.state is JobState.DEAD_LETTER and bad.attempts == 1
        assert "key field 'id'" in (bad.last_error or "") and "surrogate" in (bad.last_error or "")
        assert {spool.get(f"good{i}").state for i in range(3)} == {JobState.COMPLETED}
    assert lancedb.connect(str(index)).open_table("docs").count_rows() == 3


@pytest.mark.parametrize(("value", "says"), [([2**70], "too large"), ({1: "a"}, "dict key"),
                                             (object(), "did not recognize")],
                         ids=["int-past-64-bits", "int-keys", "object"])
def test_a_value_arrow_cannot_store_is_named_not_blamed_on_the_schema(
        tmp_path: Path, value: object, says: str) -> None:
    """A table's first write infers its schema and leaves out a column Arrow cannot store:
    the job failed with "field 'x' is not in the schema" alone, blaming the schema."""
    root, index = tmp_path / "spool", tmp_path / "index"
    with make_spool(root, max_attempts=1) as spool:
        spool.enqueue("h", job_id="bad")
        handlers = {"h": lambda job, ctx: ctx.upsert("docs", {"id": "a", "x": value})}
        Worker(spool, App(handlers=handlers, projection=str(index))).run_until_idle()
        bad = spool.get("bad")
    error = bad.last_error or ""
    assert bad.state is JobState.DEAD_LETTER
    assert "field 'x'" in error and "cannot be stored" in error and says in error, error
    # The table did not exist: its columns came from this write (it said "not in the
    # schema of table 'docs'", of a table no one had made).
    assert "left out of the columns of the new table 'docs'" in error, error
    assert "\n" not in error


def test_a_field_outside_a_declared_schema_is_named_as_not_declared(tmp_path: Path) -> None:
    """Found in a projection probe: refused from a table declared with schemas=, the field
    was said to be "left out of the columns ... inferred from its first write", as if the
    declaration had been ignored."""
    import pyarrow as pa

    from jobspool.projection import ProjectionStore

    declared = pa.schema([pa.field("id", pa.string()), pa.field("n", pa.int32())])
    store = ProjectionStore(tmp_path / "index", schemas={"decl": declared})
    result = store.apply([make_upsert("j", "decl", {"id": "a", "n": 1, "zzz": 3}, None, 1)])
    error = str(result.rejected["j"])
    assert "field 'zzz' is not among the columns declared for table 'decl'" in error, error
    assert "inferred" not in error and "(columns: id, n)" in error, error
    assert store.open("decl") is None or store.open("decl").count_rows() == 0


def test_a_row_error_quoting_a_multi_line_value_is_one_line(tmp_path: Path) -> None:
    """A 2-D array's repr put newlines into the job's last_error and the log line."""
    root, index = tmp_path / "spool", tmp_path / "index"
    handlers = {
        "good": lambda job, ctx: ctx.upsert("t", {"id": "a", "vector": [1.0, 2.0]}),
        "bad": lambda job, ctx: ctx.upsert("t", {"id": "b", "vector": np.ones((2, 2))}),
    }
    with make_spool(root, max_attempts=1) as spool:
        spool.enqueue("good", job_id="good")
        Worker(spool, App(handlers=handlers, projection=str(index))).run_until_idle()
        spool.enqueue("bad", job_id="bad")
        Worker(spool, App(handlers=handlers, projection=str(index))).run_until_idle()
        bad = spool.get("bad")
    assert bad.state is JobState.DEAD_LETTER
    assert "field 'vector'" in (bad.last_error or "") and "\n" not in (bad.last_error or "")


def test_a_readers_misuse_is_a_one_line_projection_error(tmp_path: Path) -> None:
    # Found in a projection probe: each came out as a raw error from LanceDB or pyarrow
    # (AttributeError, ValueError listing internal columns), or as a row of nothing.
    import pyarrow as pa

    from jobspool.errors import InvalidType
    from jobspool.projection import LanceProjection

    db = str(tmp_path / "db")
    with pytest.raises(InvalidType, match="must be a pyarrow.Schema"):
        LanceProjection(db, "d", schema={"id": "string"})  # type: ignore[arg-type]
    files = LanceProjection(db, "files", key="path")
    files.upsert({"path": "p1", "n": 1})
    for read, says in [
        (lambda: LanceProjection(db, "files", key="id").get("p1"), "No field named id"),
        (lambda: files.to_arrow(columns=["nope"]), "No field named nope"),
        (lambda: files.count("nope = 1"), "No field named nope"),
        (lambda: files.search("p1", query_type="fts"), "full text search"),
        (lambda: files.to_arrow(columns=["_deleted"]), "'_deleted' of table 'files' is internal"),
    ]:
        with pytest.raises(ProjectionError, match=says) as caught:
            read()
        assert "\n" not in str(caught.value) and "_rowid" not in str(caught.value)
    assert files.to_arrow(columns=["n"]).to_pylist() == [{"n": 1}]
