"""A write cancelled while its thread ran is done, then the cancellation is raised: the
README said "`get` the id to see it", but an enqueue without `job_id` left the caller no
id to get (found by an async API probe: 20 cancelled calls, 20 jobs, none findable; a
retry enqueued each twice). The cancellation now says, in a note, what landed."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from jobspool import AsyncSpool


def _notes(exc: BaseException) -> list[str]:
    return [n for n in getattr(exc, "__notes__", []) if n.startswith("jobspool:")]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_cancelled_enqueue_that_landed_names_its_job(tmp_path: Path, backend: str) -> None:
    told: list[str] = []
    returned: list[object] = []

    async def main() -> int:
        async with AsyncSpool(tmp_path / "spool") as s:
            for k in range(30):
                try:
                    with anyio.CancelScope() as scope:
                        async def cancel_soon(scope: anyio.CancelScope = scope) -> None:
                            await anyio.sleep(0.0005)
                            scope.cancel()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(cancel_soon)
                            await s.enqueue("email", {"to": k})
                except BaseException as exc:  # never reached: the scope catches its cancel
                    raise AssertionError(exc) from exc
            return (await s.stats()).total

    # Notes are read where the cancellation passes: wrap `enqueue` to see each one.
    real = AsyncSpool.enqueue

    async def spying(self: AsyncSpool, *a: object, **k: object):  # type: ignore[no-untyped-def]
        try:
            job = await real(self, *a, **k)  # type: ignore[arg-type]
            returned.append(job)
            return job
        except anyio.get_cancelled_exc_class() as exc:
            told.extend(_notes(exc))
            raise

    AsyncSpool.enqueue = spying  # type: ignore[method-assign]
    try:
        total = anyio.run(main, backend=backend)
    finally:
        AsyncSpool.enqueue = real  # type: ignore[method-assign]
    # Every job that landed under a cancellation is named (one cancelled before it began
    # lands nothing and says nothing).
    assert told, "no cancellation landed mid-call in 30 tries"
    assert all("enqueue landed before the cancellation: job " in n for n in told), told
    ids = [n.split("'")[1] for n in told]

    async def check() -> None:
        async with AsyncSpool(tmp_path / "spool") as s:
            for job_id in ids:
                assert (await s.get(job_id)).kind == "email"

    anyio.run(check, backend=backend)
    assert total == len(returned) + len(told)  # every job that landed was told of


def test_the_note_says_what_the_call_did() -> None:
    # Every call returning a job was noted "was enqueued": a cancel, a requeue, an abort,
    # an enqueue that found the job there already.
    from jobspool.async_spool import _landed
    from jobspool.queue.job import EnqueueResult

    async def main(root: Path) -> None:
        async with AsyncSpool(root) as s:
            job = await s.enqueue("k", job_id="x")
            again = await s.enqueue_result("k", job_id="x")
            canceled = await s.cancel("x")
            assert _landed(again) == "job 'x' (k, existing, now ready)"
            assert _landed(canceled) == "job 'x' (k, now canceled)"
            assert _landed(EnqueueResult(job, "created")) == "job 'x' (k, created, now ready)"
            assert _landed(None) is None

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        anyio.run(main, Path(d) / "spool")
