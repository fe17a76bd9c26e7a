"""`health` checks what lives on this machine for a database spool too (its local directory:
worker metrics, the default projection, the disk they are on), and refuses a bad threshold
on both stores. Before, a PostgreSQL spool ignored `--projection`, `--worker-stale`, the
disk bounds and their validation: ok with a dead worker or a projection path that did not
exist, exit 0 for `--min-free-percent 101`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from jobspool.metrics import METRICS_DIR
from tests.spools import make_spool


def test_a_projection_path_that_does_not_exist_is_reported(store_root: str | Path,
                                                           tmp_path: Path) -> None:
    with make_spool(store_root) as spool:
        health = spool.health(projection=tmp_path / "no-such-projection")
    assert "projection_not_found" in health.codes()
    assert not health.ok


def test_a_worker_whose_metrics_file_went_stale_is_reported(store_root: str | Path) -> None:
    with make_spool(store_root) as spool:
        metrics = Path(spool.root) / METRICS_DIR
        metrics.mkdir(parents=True, exist_ok=True)
        written = time.time() - 600
        (metrics / "dead-worker.json").write_bytes(orjson.dumps(
            {"owner": "dead-worker", "written_at": written}))
        os.utime(metrics / "dead-worker.json", (written, written))
        health = spool.health(worker_stale=60)
    assert "worker_stale" in health.codes()
    assert health.to_dict()["figures"]["stale_workers"] == 1


@pytest.mark.parametrize("options", [{"min_free_percent": 101}, {"worker_stale": 0},
                                     {"min_free_bytes": -1}, {"max_maintenance_failures": 0}])
def test_a_bad_threshold_is_refused_on_every_store(store_root: str | Path,
                                                   options: dict[str, float]) -> None:
    with make_spool(store_root) as spool, pytest.raises(ValueError) as caught:
        spool.health(**options)
    assert next(iter(options)) in str(caught.value)


def test_expired_leases_are_reported_alike_naming_the_jobs(store_root: str | Path) -> None:
    # Found in an operations probe: PostgreSQL said "3 expired lease(s) not reclaimed yet"
    # without naming a job, the file store named them with other advice: two alert texts.
    from tests.store_params import sleep_past

    with make_spool(store_root, lease_seconds=0.2) as spool:
        for i in range(4):
            spool.enqueue("k", job_id=f"j{i}")
        leases = spool.claim(limit=4)
        sleep_past(max(x.expires_at for x in leases))
        health = spool.health()
    (reason,) = [r for r in health.reasons if r.code == "expired_leases"]
    assert reason.value == 4
    assert reason.message.startswith("4 leases expired and not reclaimed (j")
    assert " and 1 more): workers died and nothing recovered; run `jobspool recover`" \
        in reason.message


def test_a_fence_behind_held_tokens_is_reported(store_root: str | Path) -> None:
    # Found in an operations probe: fsck said the counter was below tokens leases hold
    # ("tokens could be issued twice") while health said ok, exit 0.
    with make_spool(store_root) as spool:
        for i in range(3):
            spool.enqueue("k", job_id=f"j{i}")
        leases = spool.claim(limit=3)
        assert spool.health().ok
        if isinstance(store_root, Path):
            from jobspool.queue.fence import FENCE_FILE, encode_fence
            (store_root / FENCE_FILE).write_bytes(encode_fence(1))  # a restored old copy
        else:
            import psycopg
            with psycopg.connect(store_root, autocommit=True) as conn:
                conn.execute("SELECT setval('jobspool_fence', 1)")
        health = spool.health()
    (reason,) = [r for r in health.reasons if r.code == "fence_behind"]
    top = max(x.token for x in leases)
    assert reason.value == 2 and f"below token {top} held by" in reason.message
    assert "tokens could be issued twice" in reason.message and not health.ok


def test_a_fence_behind_counts_every_lease_above_it(store_root: str | Path) -> None:
    # Found in an observability probe: PostgreSQL read the 100 highest tokens and said
    # "(100 leases above it)" with 1,100 above; `recover` then raised all 1,100.
    with make_spool(store_root, durable=False) if isinstance(store_root, Path) else \
            make_spool(store_root) as spool:
        spool.enqueue_many("k", [{}] * 150)
        assert len(spool.claim(limit=150, lease_seconds=3600)) == 150
        if isinstance(store_root, Path):
            from jobspool.queue.fence import FENCE_FILE, encode_fence
            (store_root / FENCE_FILE).write_bytes(encode_fence(1))
        else:
            import psycopg
            with psycopg.connect(store_root, autocommit=True) as conn:
                conn.execute("SELECT setval('jobspool_fence', 1)")
        health = spool.health()
    (reason,) = [r for r in health.reasons if r.code == "fence_behind"]
    assert reason.value == 149 and "(149 leases above it)" in reason.message, reason  # 2..150
