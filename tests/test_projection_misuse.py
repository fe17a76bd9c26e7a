"""Misuse of the projection's read side: each refused with one line of the project's own errors.

Before: a `where` filter could close the parentheses `live_filter` put it in, so
`where="true) OR (true"` returned tombstoned (deleted) rows; a database path that is an
existing file raised a raw FileExistsError from LanceDB's mkdir; and `get(None)` or
`get(5)` raised a raw AttributeError from the quoting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobspool.errors import InvalidType, ProjectionError
from jobspool.projection.handler import LIVE_FILTER, live_filter
from jobspool.projection.lance import LanceProjection


@pytest.fixture
def proj(tmp_path: Path) -> LanceProjection:
    """A table with one live row `a` and one tombstone `b`."""
    proj = LanceProjection(tmp_path / "db", "notes")
    proj.upsert([{"id": "a", "n": 1, "text": "it's"}, {"id": "b", "n": 2, "text": "b"}], version=1)
    proj.delete("b", version=2)
    return proj


# --- 1. a `where` filter cannot reach past its parentheses


ESCAPES = [
    "true) OR (true",
    "n = 1) OR (_deleted = true",
    "true) OR _deleted OR (true",
    "true OR true --",
    "true /* ( */ ) OR ( /* ) */ true",
    "$$($$ = text) OR (true OR text = $$)$$",
    "text = 'a') OR ('1' = '1",
    "text = 'x''",
    '"n" = 1) OR ("n" = 2',
    "(true",
]


@pytest.mark.parametrize("where", ESCAPES)
def test_a_where_filter_cannot_return_tombstones(proj: LanceProjection, where: str) -> None:
    for read in (lambda: proj.to_arrow(where=where), lambda: proj.count(where),
                 lambda: proj.search(where=where, limit=None)):
        with pytest.raises(ProjectionError, match="argument 'where'") as info:
            read()
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("where", [
    "n = 1",
    "(n = 1) OR (n = 2 AND text = 'b')",
    "text = 'it''s'",
    "text = ')' OR text = '(' OR n = 1",
    '"n" IN (1, 2)',
    "`text` LIKE 'it%'",
])
def test_a_self_contained_where_filter_still_reads_live_rows_only(
    proj: LanceProjection, where: str
) -> None:
    assert [r["id"] for r in proj.to_arrow(where=where).to_pylist()] == ["a"]
    assert proj.count(where) == 1
    assert [r["id"] for r in proj.search(where=where, limit=None).to_pylist()] == ["a"]


def test_live_filter_refuses_an_escape_and_keeps_a_good_filter() -> None:
    assert live_filter(None) == LIVE_FILTER and live_filter("  ") == LIVE_FILTER
    assert live_filter("n = 1") == f"(n = 1) AND {LIVE_FILTER}"
    with pytest.raises(ProjectionError, match="argument 'where'"):
        live_filter("true) OR (true")
    with pytest.raises(InvalidType, match="argument 'where'"):
        live_filter(5)  # type: ignore[arg-type]


# --- 2. a database path that is a file


def test_a_database_path_that_is_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0::/root:/bin/sh\n")
    with pytest.raises(ProjectionError, match=r"passwd.*existing file, not a directory") as info:
        LanceProjection(path, "notes")
    assert "\n" not in str(info.value)
    reader = LanceProjection(path, "notes", key="id")  # no read at construction
    with pytest.raises(ProjectionError, match=r"passwd.*existing file"):
        reader.get("a")
    with pytest.raises(ProjectionError, match=r"passwd.*existing file"):
        reader.upsert({"id": "a"})
    assert path.read_text() == "root:x:0:0::/root:/bin/sh\n"


def test_a_database_path_under_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text("x")
    proj = LanceProjection(path / "db", "notes")  # reads as absent: nothing there to read
    with pytest.raises(ProjectionError, match=r"passwd/db.*cannot be a directory") as info:
        proj.upsert({"id": "a"})
    assert "\n" not in str(info.value)


# --- 3. get() of something that is not a key


@pytest.mark.parametrize("key", [None, 5, b"a", ["a"]])
def test_get_refuses_a_key_that_is_not_a_string(proj: LanceProjection, key: Any) -> None:
    with pytest.raises(InvalidType, match=f"must be a string, got {type(key).__name__}") as info:
        proj.get(key)
    assert isinstance(info.value, TypeError) and "\n" not in str(info.value)
    assert proj.get("a") is not None and proj.get("b") is None


@pytest.mark.parametrize("name", ["a.b", "a`b", "_rowid"])
def test_a_declared_column_lancedb_refuses_is_refused_when_declared(
        tmp_path: Path, name: str) -> None:
    """Found by a projection probe: accepted when declared, then every write to the table
    failed at the merge with LanceDB's schema error, each job retried to a dead letter."""
    import pyarrow as pa

    from jobspool.projection.lance import ProjectionStore

    declared = pa.schema([pa.field("id", pa.string()), pa.field(name, pa.string())])
    with pytest.raises(ValueError, match=f"column {name!r}"):
        ProjectionStore(tmp_path / "db", schemas={"t": declared})
    assert not (tmp_path / "db").exists()


def test_a_writer_not_told_a_tables_key_is_told_which_key_not_to_drop_the_table(
        tmp_path: Path) -> None:
    """Found by a projection probe: a table made with keys={"files": "path"} and written by a
    worker without keys= dead-lettered its jobs with "its column 'path' is NOT NULL ... make
    it nullable or drop it; ... drop this one to have it recreated": advice that loses data."""
    from jobspool.projection.handler import make_upsert
    from jobspool.projection.lance import ProjectionStore

    made = ProjectionStore(tmp_path / "db", keys={"files": "path"})
    assert made.apply([make_upsert("j1", "files", {"path": "a.md", "size": 1}, 1.0, 1,
                                   key="path")]).ok
    result = ProjectionStore(tmp_path / "db").apply(
        [make_upsert("j2", "files", {"id": "b.md", "size": 2}, 1.0, 2)])
    message = str(result.rejected["j2"])
    assert "keyed on 'path', not 'id'" in message and "keys={'files': 'path'}" in message
    assert "drop" not in message
    assert [r["path"] for r in made.table("files").to_arrow().to_pylist()] == ["a.md"]


def test_a_bad_id_in_a_delete_names_the_tables_own_key(tmp_path: Path) -> None:
    # Found probing the projection: with the key `doc_id`, a bad id in `delete` (direct or
    # `ctx.delete`) was reported as "key field 'id'", a column the table does not have.
    from jobspool import Spool, Worker

    proj = LanceProjection(tmp_path / "db", "docs", key="doc_id")
    with pytest.raises(ProjectionError, match="key field 'doc_id' of table 'docs'"):
        proj.delete([5], version=1)  # type: ignore[list-item]

    def handler(job: Any, ctx: Any) -> str:
        try:
            ctx.delete("docs", [5], version=1)
        except ProjectionError as exc:
            return str(exc)
        return "accepted"

    with Spool(tmp_path / "spool") as spool:
        job = spool.enqueue("w")
        Worker(spool, {"w": handler}, projection=str(tmp_path / "db"),
               keys={"docs": "doc_id"}).run_until_idle()
        said = spool.get(job.id).result
    assert "key field 'doc_id' of table 'docs'" in said and "'id'" not in said


def test_search_limits_and_a_wrong_dimension_are_refused_saying_what_is_wrong(
        tmp_path: Path) -> None:
    # Found probing the projection: a 2-d query on the table's 3-d vector column said
    # "There is no vector column in the data"; limit=0 or -1 said "Limit is required";
    # a filter search with limit=0 returned every row.
    proj = LanceProjection(tmp_path / "db", "docs")
    proj.upsert([{"id": f"d{i}", "vector": [float(i), 0.0, 1.0], "text": "x"}
                 for i in range(5)], version=1)
    with pytest.raises(ProjectionError, match=r"query dim\(2\) doesn't match"):
        proj.search([1.0, 0.0])
    for limit in (0, -1, True, 2.5):
        with pytest.raises(ProjectionError, match=f"limit must be a positive integer, got {limit}"):
            proj.search([1.0, 0.0, 1.0], limit=limit)  # type: ignore[arg-type]
        with pytest.raises(ProjectionError, match="limit must be a positive integer"):
            proj.search(where="text = 'x'", limit=limit)  # type: ignore[arg-type]
    with pytest.raises(ProjectionError, match="a vector search needs a limit"):
        proj.search([1.0, 0.0, 1.0], limit=None)
    assert proj.search([4.0, 0.0, 1.0], limit=2).column("id").to_pylist() == ["d4", "d3"]
    assert proj.search(where="text = 'x'", limit=None).num_rows == 5
    assert proj.search(where="text = 'x'", limit=3).num_rows == 3
    import numpy as np  # a numpy integer is a limit too (it was refused once)

    assert proj.search([4.0, 0.0, 1.0], limit=np.int64(2)).num_rows == 2
    assert proj.search(where="text = 'x'", limit=np.int32(3)).num_rows == 3


@pytest.mark.parametrize(("given", "kept"), [
    (None, "warn,lance::dataset::optimize=error"), ("debug", "debug")])
def test_lancedbs_compaction_race_warning_is_quieted_unless_the_operator_set_a_level(
        tmp_path: Path, given: str | None, kept: str) -> None:
    # Found probing: a compaction losing a commit race, reported by maintenance as
    # `deferred`, also printed LanceDB's raw Rust WARN line, read as a failure.
    import subprocess
    import sys

    from tests.subproc import REPO, cli_env

    env = {k: v for k, v in cli_env().items() if k != "LANCEDB_LOG"}
    if given is not None:
        env["LANCEDB_LOG"] = given
    code = ("import os, sys; from jobspool.projection.lance import LanceProjection; "
            "LanceProjection(sys.argv[1], 't').upsert({'id': 'a'}, version=1); "
            "print(os.environ['LANCEDB_LOG'])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "db")], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == kept
