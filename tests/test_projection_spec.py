"""A projection that cannot work is refused when the App or Worker is built, in one line,
before any job is claimed: found at the first write instead, it cost every job an attempt
(retried with LanceDB's error, then dead-lettered) while the run exited 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobspool import App, Job, Spool, Worker
from jobspool.errors import AppError, ConfigError
from tests.cli_harness import run_cli
from tests.spools import make_spool


def _noop(job: Job, ctx: Any) -> None:
    return None


@pytest.mark.parametrize(("spec", "keys", "says"), [
    (42, None, "projection must be a LanceDB URI"),
    ("s3://", None, "names no bucket"),
    ("gs:///path", None, "names no bucket"),
    ("s3:/bucket/x", None, "two slashes"),  # a projection probe: each job charged, then dead
    # Also found probing: LanceDB refused these at each job's first write.
    ("db://x", None, "LanceDB cannot connect to it: api_key is required"),
    ("s3a://bucket/x", None, "No object store provider found for scheme: 's3a'"),
    (None, {"docs": "bad col!"}, "keys['docs']"),
    (None, {"docs": "version"}, "reserved column"),
])
def test_an_unusable_projection_is_refused_at_construction(
        tmp_path: Path, spec: Any, keys: Any, says: str) -> None:
    with pytest.raises(AppError, match=says.replace("[", r"\[").replace("]", r"\]")):
        App(handlers={"k": _noop}, projection=spec, keys=keys or {})
    spool = make_spool(tmp_path / "s")
    with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
        Worker(spool, {"k": _noop}, projection=spec, keys=keys)
    spool.close()


def test_a_file_or_a_bad_uri_given_on_the_cli_exits_1_and_claims_nothing(
        tmp_path: Path) -> None:
    root, afile = tmp_path / "s", tmp_path / "not-a-dir"
    afile.write_text("x")
    with make_spool(root) as spool:
        job = spool.enqueue("work")
    for spec in (str(afile), "s3://"):
        code, _, err = run_cli("run-until-idle", "--app", "tests.apps.simple:app",
                               "--projection", spec, root=root)
        assert code == 1 and len(err.strip().splitlines()) == 1, err
    with Spool(root) as spool:
        after = spool.get(job.id)
    assert (after.state.value, after.attempts) == ("ready", 0)


def test_a_path_under_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    # Found probing: `--projection FILE/sub` claimed the jobs and deferred each as a storage
    # failure, for ever, where `--projection FILE` was refused at once.
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    for spec in (afile / "sub", afile / "a" / "b", f"file://{afile}/sub"):
        with pytest.raises(ConfigError, match=f"'{afile}' is a file, not a directory"):
            Worker(make_spool(tmp_path / "s"), {"k": _noop}, projection=spec)


def test_memory_on_the_cli_is_refused_before_anything_is_claimed(tmp_path: Path) -> None:
    # Found probing: the worker projected into its own in-process database and reported
    # rows that were gone when it exited.
    root = tmp_path / "s"
    with make_spool(root) as spool:
        job = spool.enqueue("work")
    code, _, err = run_cli("run-until-idle", "--app", "tests.apps.simple:app",
                           "--projection", "memory://", root=root)
    assert code == 1 and "in-process database" in err and "Traceback" not in err, err
    with Spool(root) as spool:
        assert spool.get(job.id).state.value == "ready"


def test_usable_projections_are_accepted(tmp_path: Path) -> None:
    for spec in (None, str(tmp_path / "new-dir"), tmp_path, "memory://", "s3://bucket/x"):
        App(handlers={"k": _noop}, projection=spec)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["completed", "ready/x", "tmp", "."])
def test_a_projection_inside_the_spools_own_directories_is_refused(
        tmp_path: Path, where: str) -> None:
    # Found in the robustness pass: LanceDB's files inside completed/ were read as broken
    # jobs (fsck failed, recover quarantined them). <root>/index is the default and fine.
    root = tmp_path / "spool"
    with make_spool(root) as spool:
        with pytest.raises(ConfigError, match="spool"):
            Worker(spool, {"k": lambda job, ctx: None}, projection=str(root / where))
        Worker(spool, {"k": lambda job, ctx: None}, projection=str(root / "index"))
        Worker(spool, {"k": lambda job, ctx: None}, projection=str(tmp_path / "elsewhere"))


def test_maintain_refuses_a_missing_or_misplaced_projection_and_a_bad_table_name(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    make_spool(root).close()
    for args, says in [
        (("--projection", str(tmp_path / "typo")), "no such directory"),
        (("--projection", str(root / "completed")), "inside the spool's own completed/"),
        (("--tables", "../typo"), "invalid table name '../typo'"),
        (("--tables", ".."), "invalid table name '..'"),
        (("--tables", ".x"), "invalid table name '.x'"),
    ]:
        code, out, err = run_cli("maintain", *args, root=root)
        assert code == 1 and out == "", (args, code, out, err)
        assert len(err.strip().splitlines()) == 1 and says in err, (args, err)
    assert not (tmp_path / "typo").exists()
    code, _out, _err = run_cli("health", root=root)
    assert code == 0  # nothing was recorded as failing
    assert sorted(p.name for p in (root / "completed").iterdir()) == []


def test_maintain_refuses_a_missing_projection_named_by_the_app(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found in a README walk-through: `--projection typo` was refused, but the same typo in
    # the app's `App(projection=...)` printed "no tables" and exited 0.
    root = tmp_path / "spool"
    make_spool(root).close()
    missing = tmp_path / "typo_index"
    (tmp_path / "typo_app_mod.py").write_text(
        "from jobspool import App\n"
        f"app = App(handlers={{'k': lambda job, ctx: None}}, projection={str(missing)!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_cli("maintain", "--app", "typo_app_mod:app", root=root)
    assert (code, out) == (1, ""), (code, out, err)
    assert len(err.strip().splitlines()) == 1
    assert "typo_app_mod:app" in err and str(missing) in err and "no such directory" in err
    assert not missing.exists()
    # The default projection (<root>/index) not made yet is no typo: nothing to maintain.
    code, out, err = run_cli("maintain", root=root)
    assert (code, out.strip()) == (0, "no tables"), err


def test_keys_that_disagree_with_the_projection_stores_own_are_refused(tmp_path: Path) -> None:
    from jobspool.projection.lance import ProjectionStore

    store = ProjectionStore(str(tmp_path / "proj"), keys={"docs": "doc_id"})
    with pytest.raises(AppError, match=r"keys\['docs'\] is 'id'.*'doc_id'"):
        App(handlers={"k": _noop}, projection=store, keys={"docs": "id"})
    spool = make_spool(tmp_path / "s")
    with pytest.raises(ConfigError, match=r"keys\['docs'\] is 'url'.*'doc_id'"):
        Worker(spool, {"k": _noop}, projection=store, keys={"docs": "url"})
    # the same keys on both sides, or keys given to the store alone, are fine
    App(handlers={"k": _noop}, projection=store, keys={"docs": "doc_id"})
    Worker(spool, {"k": _noop}, projection=store)
    spool.close()


@pytest.mark.parametrize("store_keys", [{"key": "path"}, {"keys": {"files": "path"}}],
                         ids=["store-key", "store-keys"])
def test_handlers_write_with_the_keys_of_the_projection_store_they_were_given(
        tmp_path: Path, store_keys: dict[str, Any]) -> None:
    # Found in a projection probe: the worker validated rows against its own keys ("id"),
    # so every job writing a table the store keys on "path" was dead-lettered "row for
    # table 'files' is missing its key field 'id'".
    from jobspool.projection import LanceProjection
    from jobspool.projection.lance import ProjectionStore

    store = ProjectionStore(str(tmp_path / "proj"), **store_keys)

    def index(job: Job, ctx: Any) -> None:
        ctx.upsert("files", {"path": job.payload, "size": 1}, version=10)
        ctx.delete("files", ["gone"], version=11)

    with make_spool(tmp_path / "s") as spool:
        spool.enqueue("k", "a.txt", job_id="a")
        report = Worker(spool, {"k": index}, projection=store).run_until_idle()
        assert report.completed == 1, spool.get("a").last_error
    table = LanceProjection(str(tmp_path / "proj"), "files")
    assert table.key == "path"
    assert table.get("a.txt") == {"path": "a.txt", "size": 1, "version": 10.0, "fence": 1}
    assert table.get("gone") is None


@pytest.mark.parametrize("spec", ["gs://", "az://", "s3://"])
def test_maintain_given_an_object_store_uri_without_a_bucket_says_so_in_one_line(
        tmp_path: Path, spec: str) -> None:
    """Found by a projection probe: `maintain --projection gs://` printed a 48-line traceback
    where the worker says in one line that the URI names no bucket."""
    make_spool(tmp_path / "s").close()
    code, _, err = run_cli("maintain", "--projection", spec, root=tmp_path / "s")
    assert code == 1 and "names no bucket" in err
    assert len(err.strip().splitlines()) == 1, err
