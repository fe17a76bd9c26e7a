"""What runs inside the benchmark's child processes.

Every measured role runs in its own spawned process: it opens its queue, says
it is ready, waits for the common start signal, and reports the monotonic time
(system-wide on Linux, so comparable across processes) at which it finished,
plus what it completed and its peak RSS (``getrusage`` in the child itself).
"""

from __future__ import annotations

import os
import resource
import time
import traceback
from typing import Any


def rss_mb() -> float:
    """Peak resident set size of this process so far, in MB.

    ``VmHWM`` from ``/proc/self/status``, not ``getrusage``: Linux carries
    ``ru_maxrss`` across ``execve`` from the (v)forked parent, so a spawned
    child's ``ru_maxrss`` is at least its parent's RSS at spawn time.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return ru_maxrss_mb()


def ru_maxrss_mb() -> float:
    """``getrusage``'s peak RSS in MB (Linux reports KiB); see ``rss_mb`` for its caveat."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(
    role: str, params: dict[str, Any], ready: Any, start: Any, producer_done: Any, results: Any
) -> None:
    """Entry point of a child: run ``role`` and put ``(role, result | error)`` on ``results``."""
    try:
        result = ROLES[role](params, ready, start, producer_done)
        result["rss_mb"] = rss_mb()
        result["ru_maxrss_mb"] = ru_maxrss_mb()
        results.put((role, result, None))
    except BaseException:
        ready.put(role)  # never leave the parent waiting for a dead child
        results.put((role, None, traceback.format_exc(limit=8)))


def _open(params: dict[str, Any]) -> Any:
    from bench.peers import open_adapter

    return open_adapter(params["queue"], params["root"], pad=params["pad"])


def _producer(params: dict[str, Any], ready: Any, start: Any, producer_done: Any) -> dict[str, Any]:
    ids, batch = params["ids"], params["batch"]
    adapter = _open(params)
    ready.put("producer")
    start.wait()
    t0 = time.monotonic()
    try:
        for k in range(0, len(ids), batch):
            adapter.enqueue(ids[k : k + batch])
    finally:
        producer_done.set()
    t_end = time.monotonic()
    adapter.close()
    return {"t_start": t0, "t_end": t_end, "n": len(ids)}


def _consumer(params: dict[str, Any], ready: Any, start: Any, producer_done: Any) -> dict[str, Any]:
    batch, io = params["batch"], params["io_ms"] / 1000
    deadline_s = params["deadline_s"]
    adapter = _open(params)
    rss_open = rss_mb()
    ready.put("consumer")
    start.wait()
    t0 = time.monotonic()
    t_end = t0
    done: list[int] = []
    claimed_n = 0
    timed_out = False
    while True:
        if time.monotonic() - t0 > deadline_s:
            timed_out = True
            break
        # Read the flag before claiming: an empty claim after the producer was
        # done means nothing is left to claim.
        finished = producer_done.is_set()
        claimed = adapter.claim(batch)
        if not claimed:
            if finished:
                break
            time.sleep(0.002)
            continue
        claimed_n += len(claimed)
        if io:
            for _ in claimed:
                time.sleep(io)  # a handler waiting on I/O, one job after the other
        done.extend(adapter.complete(claimed))
        t_end = time.monotonic()
    adapter.close()
    return {
        "t_start": t0,
        "t_end": t_end,
        "ids": done,
        "claimed": claimed_n,
        "timed_out": timed_out,
        "rss_open_mb": rss_open,
    }


def _prefill(params: dict[str, Any], ready: Any, start: Any, producer_done: Any) -> dict[str, Any]:
    adapter = _open(params)
    ready.put("prefill")
    start.wait()
    t0 = time.monotonic()
    adapter.prefill(params["ids"])
    adapter.close()
    os.sync()
    return {"t_start": t0, "t_end": time.monotonic(), "n": len(params["ids"])}


def _cycle(params: dict[str, Any], ready: Any, start: Any, producer_done: Any) -> dict[str, Any]:
    """Steady state at a given depth: enqueue a batch, claim the oldest batch, complete it."""
    ids, batch, budget = params["ids"], params["batch"], params["budget_s"]
    rss_import = rss_mb()
    adapter = _open(params)
    w0 = time.monotonic()
    adapter.warm()
    t_warm = time.monotonic() - w0
    rss_open = rss_mb()
    ready.put("cycle")
    start.wait()
    t0 = time.monotonic()
    t_enq = t_con = 0.0
    done: list[int] = []
    enqueued = 0
    capped = False
    for k in range(0, len(ids), batch):
        if time.monotonic() - t0 > budget:
            capped = True
            break
        a = time.monotonic()
        adapter.enqueue(ids[k : k + batch])
        b = time.monotonic()
        claimed = adapter.claim(batch)
        done.extend(adapter.complete(claimed))
        c = time.monotonic()
        enqueued += len(ids[k : k + batch])
        t_enq += b - a
        t_con += c - b
    t_end = time.monotonic()
    adapter.close()
    return {
        "t_start": t0,
        "t_end": t_end,
        "ids": done,
        "enqueued": enqueued,
        "capped": capped,
        "t_enqueue": t_enq,
        "t_consume": t_con,
        "t_warm": t_warm,
        "rss_import_mb": rss_import,
        "rss_open_mb": rss_open,
    }


def _physical(params: dict[str, Any], ready: Any, start: Any, producer_done: Any) -> dict[str, Any]:
    from bench.physical import measure

    ready.put("physical")
    start.wait()
    return measure(params["root"], params["n"], params["batch"])


ROLES = {
    "producer": _producer,
    "consumer": _consumer,
    "prefill": _prefill,
    "cycle": _cycle,
    "physical": _physical,
}
