"""A database spool's default projection is one, whatever URL names the database.

Its default projection lives in this machine's directory for the spool, named by the URL:
two spellings of one database (`?application_name=`, `localhost` for `127.0.0.1`,
`postgres://`) made two directories, and each worker wrote an index of its own, each
holding only the rows of the runs that named it so (no warning, exit 0). The default now
follows the directory of the same database that already holds an index.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspool import Spool, Worker
from jobspool.projection import LanceProjection
from jobspool.queue.layout import default_projection_of
from tests.pgserver import new_schema


@pytest.fixture()
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JOBSPOOL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _spelled_otherwise(url: str, name: str) -> str:
    return url + ("&" if "?" in url else "?") + f"application_name={name}"


def _note(job, ctx) -> None:  # type: ignore[no-untyped-def]
    ctx.upsert("notes", {"id": job.id, "text": job.payload}, version=1)


def test_two_spellings_of_one_database_write_one_index(pg_url: str, state_dir: Path) -> None:
    with Spool(pg_url) as first:
        first.enqueue("note", "a", job_id="pa")
        Worker(first, {"note": _note}).run_until_idle()
    with Spool(_spelled_otherwise(pg_url, "w2")) as second:
        assert second.root != first.root  # two directories, as two URLs make
        second.enqueue("note", "b", job_id="pb")
        Worker(second, {"note": _note}).run_until_idle()
        uri = default_projection_of(second)
    assert uri == str(first.root / "index")
    table = LanceProjection(uri, "notes")
    assert table.get("pa") is not None and table.get("pb") is not None
    assert not (second.root / "index").exists()


def test_another_database_keeps_its_own_default(pg_url: str, pg_server: object,
                                                state_dir: Path) -> None:
    """A spool in another schema is another spool: it never takes this one's index."""
    _, other_url = new_schema(pg_server.url)  # type: ignore[attr-defined]
    with Spool(pg_url) as one:
        one.enqueue("note", "a", job_id="pa")
        Worker(one, {"note": _note}).run_until_idle()
    with Spool(other_url) as other:
        assert default_projection_of(other) == str(other.root / "index")


def test_a_file_spool_keeps_root_index(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    assert default_projection_of(spool) == str(tmp_path / "spool" / "index")
