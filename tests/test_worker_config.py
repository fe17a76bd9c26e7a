"""`WorkerConfig` (queue/config.py): validated once at worker construction, then frozen,
and the per-kind answers the pipeline asks of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from jobspool import Context, Job, Spool, Worker
from jobspool.errors import ConfigError, InvalidJob, PolicyError
from jobspool.policy import Policy
from jobspool.queue.config import WorkerConfig
from jobspool.queue.machine import RetryPolicy


def sync_handler(job: Job, ctx: Context) -> None:
    return None


async def async_handler(job: Job, ctx: Context) -> None:
    return None


class AsyncCallable:
    async def __call__(self, job: Job, ctx: Context) -> None:
        return None


def make(handlers: Any = None, **kwargs: Any) -> WorkerConfig:
    kwargs.setdefault("owner", "me")
    kwargs.setdefault("lease_seconds", None)
    kwargs.setdefault("default_lease_seconds", 60.0)
    kwargs.setdefault("retry_base_seconds", 1.0)
    kwargs.setdefault("retry_max_seconds", 300.0)
    return WorkerConfig.create({"a": sync_handler} if handlers is None else handlers, **kwargs)


def test_defaults_claim_every_handled_kind_for_the_spools_lease_time() -> None:
    config = make({"a": sync_handler, "b": async_handler})
    assert (config.kinds, config.lease_seconds, config.concurrency, config.batch_size,
            config.grace_seconds, dict(config.keys)) == (frozenset({"a", "b"}), 60.0, 4, 50,
                                                         30.0, {})


def test_async_handlers_are_told_apart_from_sync_ones_including_async_callable_objects() -> None:
    config = make({"s": sync_handler, "a": async_handler, "o": AsyncCallable()})
    assert [config.is_async(k) for k in ("s", "a", "o")] == [False, True, True]


def test_the_per_kind_answers_come_from_the_kinds_policy() -> None:
    config = make({"a": sync_handler, "b": sync_handler}, policies={
        "a": Policy(max_attempts=2, timeout=3.0, retry_base_seconds=10.0,
                    retry_on=(KeyError,))})
    assert (config.timeout_for("a"), config.max_attempts_for("a")) == (3.0, 2)
    assert (config.timeout_for("b"), config.max_attempts_for("b")) == (None, None)
    assert config.retries("a", KeyError("k")) and not config.retries("a", ValueError("v"))
    assert config.retries("b", ValueError("v"))
    # A policy that sets only the base keeps the spool's ceiling.
    assert config.retry_policy("a") == RetryPolicy(10.0, 300.0)
    assert config.retry_policy("b") is None


def test_a_config_and_its_mappings_cannot_be_changed_in_place() -> None:
    config = make(keys={"notes": "path"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.batch_size = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.keys["other"] = "id"  # type: ignore[index]
    with pytest.raises(TypeError):
        config.handlers["b"] = sync_handler  # type: ignore[index]


@pytest.mark.parametrize(("kwargs", "error", "named"), [
    ({"handlers": {}}, ConfigError, "at least one handler"),
    ({"handlers": {"a": 42}}, ConfigError, "42"),
    ({"handlers": {"bad kind!": sync_handler}}, InvalidJob, "'bad kind!'"),
    ({"concurrency": 0}, InvalidJob, "concurrency must be >= 1, got 0"),
    ({"batch_size": "many"}, InvalidJob, "'many'"),
    ({"lease_seconds": 0}, InvalidJob, "lease_seconds"),
    ({"grace_seconds": -1.0}, InvalidJob, "-1.0"),
    ({"kinds": ["a", "zzz"]}, ConfigError, "'zzz'"),
    ({"policies": {"zzz": Policy()}}, PolicyError, "'zzz'"),
])
def test_a_bad_value_is_refused_in_one_line_naming_it(kwargs: dict[str, Any],
                                                       error: type[Exception], named: str) -> None:
    handlers = kwargs.pop("handlers", None)
    with pytest.raises(error) as caught:
        make(handlers, **kwargs)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_a_worker_refuses_a_bad_value_at_construction(spool: Spool) -> None:
    with pytest.raises(InvalidJob, match="concurrency must be >= 1, got 0"):
        Worker(spool, {"a": sync_handler}, concurrency=0)
    with pytest.raises(ConfigError, match="kinds without a handler"):
        Worker(spool, {"a": sync_handler}, kinds=["b"])


def test_setting_a_workers_grace_or_owner_replaces_its_config_and_keeps_the_old_one_whole(
        spool: Spool) -> None:
    worker = Worker(spool, {"a": sync_handler}, owner="first", grace_seconds=5.0)
    before = worker.config
    worker.grace_seconds = 1.5
    worker.owner = "second"
    assert (worker.config.grace_seconds, worker.config.owner) == (1.5, "second")
    assert (before.grace_seconds, before.owner) == (5.0, "first")  # a running pipeline's copy
    with pytest.raises(InvalidJob, match="grace_seconds"):
        worker.grace_seconds = -3.0
    with pytest.raises(ConfigError, match="owner"):
        worker.owner = ""
    assert (worker.grace_seconds, worker.owner) == (1.5, "second")


def test_a_worker_takes_its_lease_time_and_backoff_from_the_spool_unless_told(
        spool: Spool) -> None:
    worker = Worker(spool, {"a": sync_handler},
                    policies={"a": Policy(retry_max_seconds=20.0)})
    assert worker.config.lease_seconds == spool.lease_seconds
    assert worker.config.retry_policy("a") == RetryPolicy(spool.retry_base_seconds, 20.0)
    assert Worker(spool, {"a": sync_handler}, lease_seconds=7.0).lease_seconds == 7.0


def test_a_worker_or_spool_built_from_the_wrong_objects_says_what_it_needs(
        tmp_path: Path) -> None:
    """Raised at construction, in one line naming what to pass (they failed later on a
    missing attribute: 'str' has no 'lease_seconds', 'list' has no 'items')."""
    with pytest.raises(TypeError, match=r"Worker needs an open Spool.*Worker\(Spool\(root\)"):
        Worker(str(tmp_path), {"k": sync_handler})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Worker needs an open Spool"):
        Worker(None, {"k": sync_handler})  # type: ignore[arg-type]
    spool = Spool(tmp_path / "s", durable=False)
    with pytest.raises(TypeError, match="handlers must map job kinds"):
        Worker(spool, [sync_handler])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Spool root must be a directory path"):
        Spool(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidJob, match="clock"):
        Spool(tmp_path / "s", clock=5)  # type: ignore[arg-type]
    spool.close()


def test_a_policys_base_above_the_spools_cap_is_capped_by_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """DESIGN §3: backoff is capped at retry_max_seconds; a policy that leaves the cap to
    the spool (None) is capped by the spool's, as the spool caps its own base. It was
    silent: the start now says so, once, naming the kind and the way to wait longer."""
    with caplog.at_level("WARNING", logger="jobspool"):
        config = make({"a": sync_handler, "b": sync_handler},
                      policies={"a": Policy(retry_base_seconds=500.0),
                                "b": Policy(retry_base_seconds=500.0, retry_max_seconds=900.0)},
                      retry_max_seconds=300.0)
    policy = config.retry_policy("a")
    assert policy == RetryPolicy(300.0, 300.0)
    assert max(policy.delay(n) for n in range(1, 8)) <= 300.0
    assert config.retry_policy("b") == RetryPolicy(500.0, 900.0)
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "kind 'a'" in warned and "500" in warned and "retry_max_seconds 300" in warned


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"max_attempts": 10**20}, str(10**20)), ({"max_attempts": 1 << 63}, str(1 << 63)),
    ({"retry_on": "OSError"}, "'OSError'"),
    # float() of it raised a raw OverflowError naming no field (a policy probe).
    ({"timeout": 10**400}, "Policy timeout must be a positive finite number of seconds, "
                           "got an integer of 401 digits"),
    ({"retry_base_seconds": -10**400}, "retry_base_seconds")])
def test_a_policy_value_that_could_never_be_used_is_refused_naming_it(
        kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(PolicyError) as caught:
        Policy(**kwargs)
    text = str(caught.value)
    assert "\n" not in text
    assert named in text
