"""What a producer call returns is a snapshot of the stored job (DESIGN §5: `Job` is an
immutable snapshot of the file): it kept the caller's own payload object, so it changed
when the caller reused its dict, held tuples the file stores as lists, and did not equal
`get()` of the same job."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from jobspool import AsyncSpool, Spool


def test_enqueue_returns_the_payload_as_stored_not_the_callers_object(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    payload = {"a": [1], "t": (1, 2), "n": {"deep": [(3,)]}}
    job = spool.enqueue("k", payload, job_id="one")
    payload["a"].append(2)
    payload["n"]["deep"].append((4,))
    assert job.payload == {"a": [1], "t": [1, 2], "n": {"deep": [[3]]}}
    assert job == spool.get("one")


def test_enqueue_many_replace_and_prepare_return_snapshots(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool()
    shared = {"tags": ["x"]}
    jobs = spool.enqueue_many("k", [shared, (1, (2,))], job_ids=["m1", "m2"])
    shared["tags"].append("y")
    assert [j.payload for j in jobs] == [{"tags": ["x"]}, [1, [2]]]
    assert jobs == [spool.get("m1"), spool.get("m2")]
    replaced = spool.enqueue("k", shared, job_id="m1", on_conflict="replace")
    shared["tags"].clear()
    assert replaced.payload == {"tags": ["x", "y"]} and replaced == spool.get("m1")
    spool.prepare("k", shared, job_id="p1")
    shared["tags"].append("z")
    assert spool.get("p1").payload == {"tags": []}


def test_async_enqueue_returns_a_snapshot(store_root: object) -> None:
    async def main() -> None:
        async with AsyncSpool(store_root) as spool:
            payload = {"a": (1,)}
            job = await spool.enqueue("k", payload, job_id="async")
            payload["b"] = 2
            assert job.payload == {"a": [1]}
            assert job == await spool.get("async")

    anyio.run(main)
