"""`await AsyncSpool.open(root)`: the opening runs in a worker thread, not on the event loop."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from jobspool import AsyncSpool
from jobspool.errors import JobspoolError


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that takes TCP connections and never answers: a database that hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


def test_open_in_a_thread_opens_a_file_spool_closed_by_async_with(tmp_path: Path) -> None:
    async def main() -> None:
        spool = await AsyncSpool.open(tmp_path / "s")
        async with spool:
            job = await spool.enqueue("k", {"n": 1})
            assert (await spool.get(job.id)).payload == {"n": 1}
        with pytest.raises(JobspoolError):
            await spool.enqueue("k", {"n": 2})  # closed with the block

    anyio.run(main)


def test_the_loop_keeps_running_while_a_hung_database_is_opened(silent_server: int) -> None:
    url = f"postgresql://nobody@127.0.0.1:{silent_server}/db?connect_timeout=2"
    ticks = 0
    failed: list[BaseException] = []

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async def opener(tg: anyio.abc.TaskGroup) -> None:
        try:
            await AsyncSpool.open(url)
        except JobspoolError as exc:
            failed.append(exc)
        tg.cancel_scope.cancel()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            tg.start_soon(opener, tg)

    anyio.run(main)
    assert failed and "\n" not in str(failed[0]), failed
    assert ticks >= 10, ticks  # a blocked loop would not have ticked once before the failure
