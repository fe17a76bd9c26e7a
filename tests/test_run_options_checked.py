"""A worker run's and `stats`' options checked before anything runs (found by an async
API probe): `progress=5` ran every job, then raised a bare ExceptionGroup of "'int' object
is not callable" and the run's report was lost; `handle_signals="no"` (truthy) turned
signal handling on; `stats(by_kind="yes")` was taken as True."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import AsyncSpool, JobState, Worker
from jobspool.errors import InvalidType
from tests.spools import make_spool


def _noop(job: Any, ctx: Any) -> None:
    return None


@pytest.mark.parametrize("options", [{"progress": 5}, {"progress": "print"},
                                     {"handle_signals": "no"}, {"handle_signals": 1}])
def test_a_bad_run_option_is_refused_before_any_job_runs(store_root: str | Path,
                                                         options: dict[str, Any]) -> None:
    with make_spool(store_root) as spool:
        spool.enqueue_many("h", [1, 2, 3])
        name = next(iter(options))
        with pytest.raises(InvalidType, match=name):
            Worker(spool, {"h": _noop}).run_until_idle(**options)
        assert spool.stats().counts[JobState.READY.value] == 3  # nothing ran

        async def serve() -> None:
            await Worker(spool, {"h": _noop}).arun_forever(**options)

        with pytest.raises(InvalidType, match=name):
            anyio.run(serve)
        assert spool.stats().counts[JobState.READY.value] == 3


def test_stats_by_kind_takes_true_or_false_only(tmp_path: Path) -> None:
    with make_spool(tmp_path / "spool") as spool, pytest.raises(InvalidType, match="by_kind"):
        spool.stats(by_kind="yes")  # type: ignore[arg-type]

    async def main() -> None:
        async with AsyncSpool(tmp_path / "spool") as aspool:
            with pytest.raises(InvalidType, match="by_kind"):
                await aspool.stats(by_kind="yes")  # type: ignore[arg-type]

    anyio.run(main)


def test_a_progress_callback_that_raises_is_its_own_error_not_a_group(
        store_root: str | Path) -> None:
    # It came out wrapped in an ExceptionGroup: `except ValueError` did not catch it.
    def progress(report: Any) -> None:
        raise ValueError("my display broke")

    with make_spool(store_root) as spool:
        for run in (lambda w: w.run_until_idle(progress=progress),
                    # In its signal watcher's task group, and `run_forever`'s, it still came
                    # out wrapped (the CLI's `run-until-idle` passes handle_signals=True).
                    lambda w: w.run_until_idle(progress=progress, handle_signals=True),
                    lambda w: w.run_forever(progress=progress, handle_signals=False)):
            spool.enqueue_many("h", [1, 2])
            with pytest.raises(ValueError, match="my display broke"):
                run(Worker(spool, {"h": _noop}))
            assert not list(spool.jobs(state="leased"))  # nothing left held
