"""`WorkerConfig`: what a `Worker` is configured with, checked once, then frozen.

The handlers and the kinds it claims, the projection keys its handlers write
under, its owner name, batch size, concurrency, lease and grace seconds, and
the per-kind policies with the answers the pipeline asks of them (is the
handler async, its time limit, whether an exception retries, its backoff, its
attempt cap). `WorkerConfig.create` validates everything at worker
construction, so a bad value is a one-line error at start-up and never a
failure in the middle of a run.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jobspool.errors import ConfigError, InvalidJob
from jobspool.policy import Policy, check_policies
from jobspool.queue.arguments import listed
from jobspool.queue.job import Job, validate_int, validate_kind, validate_owner, validate_seconds
from jobspool.queue.machine import RetryPolicy
from jobspool.queue.payload import MIN_WORKER_LEASE

log = logging.getLogger("jobspool.queue.worker")

if TYPE_CHECKING:
    from jobspool.queue.context import Context

Handler = Callable[[Job, "Context"], Any]


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004 - async callable objects


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """A worker's configuration; build it with `create`, which validates it.

    The mappings are read-only views: a config is shared by every run of its
    worker, and a run must not see it change under it (`Worker` replaces the
    whole config when its `owner` or `grace_seconds` is set).
    """

    handlers: Mapping[str, Handler]
    kinds: frozenset[str]
    keys: Mapping[str, str]
    owner: str
    batch_size: int
    concurrency: int
    lease_seconds: float
    grace_seconds: float
    policies: Mapping[str, Policy]
    retry_policies: Mapping[str, RetryPolicy]
    async_kinds: frozenset[str]

    @classmethod
    def create(
        cls,
        handlers: Mapping[str, Handler] | None,
        *,
        owner: str,
        lease_seconds: float | None,
        default_lease_seconds: float,
        retry_base_seconds: float,
        retry_max_seconds: float,
        concurrency: int = 4,
        batch_size: int = 50,
        kinds: Sequence[str] | None = None,
        grace_seconds: float = 30.0,
        keys: Mapping[str, str] | None = None,
        policies: Mapping[str, Policy] | None = None,
    ) -> WorkerConfig:
        """Check every value (`ConfigError` and friends, one line naming it) and freeze them.

        `default_lease_seconds`, `retry_base_seconds` and `retry_max_seconds`
        are the spool's: a worker leases for the spool's time unless told
        otherwise, and a policy that sets only one end of the backoff keeps
        the spool's other end.
        """
        if not handlers:
            raise ConfigError("a worker needs at least one handler (kind -> function)")
        for kind, fn in handlers.items():
            validate_kind(kind)
            if not callable(fn):
                raise ConfigError(f"handler for kind {kind!r} is not callable: {fn!r}")
        table = dict(handlers)
        owner = _checked_owner(owner)
        if kinds is not None:
            kinds = [kinds] if isinstance(kinds, str) else listed("kinds", kinds, "job kinds")
        if keys is not None and not isinstance(keys, Mapping):
            raise ConfigError(f"keys must map table names to key columns, got {keys!r:.80}")
        concurrency = validate_int("concurrency", concurrency, minimum=1)
        batch_size = validate_int("batch_size", batch_size, minimum=1)
        lease = default_lease_seconds if lease_seconds is None else validate_seconds(
            "lease_seconds", lease_seconds, positive=True)
        if lease < MIN_WORKER_LEASE:
            raise ConfigError(f"lease_seconds {lease:g} is too short for a worker: at least "
                              f"{MIN_WORKER_LEASE:g} s (it must start each job and beat its "
                              "lease within it)")
        grace = validate_seconds("grace_seconds", grace_seconds)
        if kinds is not None:
            if not kinds:
                # Claiming nothing, it would report its own kinds as unhandled and idle for
                # ever: refused, as `--kinds ""` is on the CLI (None serves every kind).
                raise ConfigError(f"kinds names no kind (it handles: "
                                  f"{', '.join(sorted(table))}); pass None for all of them")
            missing = sorted(set(kinds) - set(table))
            if missing:
                raise ConfigError(f"kinds without a handler in this worker: "
                                  f"{', '.join(map(repr, missing))}")
        for kind, fn in table.items():
            _check_arity(kind, fn)
        checked = check_policies(policies, table)
        # A field left None is the spool's: a policy's base above the spool's cap is capped
        # by it (DESIGN §3: backoff "capped at retry_max_seconds"), as the spool caps its own.
        for kind, p in checked.items():
            if p.retry_base_seconds is not None and p.retry_max_seconds is None \
                    and p.retry_base_seconds > retry_max_seconds:
                # Said once at start: a policy asking for 600 s retried after the spool's
                # 300 without a word.
                log.warning("kind %r: Policy retry_base_seconds %g is above the spool's "
                            "retry_max_seconds %g, which caps it (give the Policy its own "
                            "retry_max_seconds to wait longer)", kind, p.retry_base_seconds,
                            retry_max_seconds)
        retry_policies = {
            kind: backoff for kind, p in checked.items()
            if (backoff := kind_backoff(p, retry_base_seconds, retry_max_seconds)) is not None}
        return cls(
            handlers=MappingProxyType(table),
            kinds=frozenset(table if kinds is None else kinds),
            keys=MappingProxyType(dict(keys or {})),
            owner=owner,
            batch_size=batch_size,
            concurrency=concurrency,
            lease_seconds=lease,
            grace_seconds=grace,
            policies=MappingProxyType(checked),
            retry_policies=MappingProxyType(retry_policies),
            async_kinds=frozenset(k for k, fn in table.items() if _is_async(fn)),
        )

    def replace(self, *, owner: str | None = None, grace_seconds: float | None = None,
                keys: Mapping[str, str] | None = None) -> WorkerConfig:
        """This config with another owner or grace period (the two a worker lets be set
        after construction: the CLI's `--grace`, a pool child's owner name), or the keys
        its projection store merges on (`projection.spec.keys_of`)."""
        changes: dict[str, Any] = {}
        if keys is not None:
            changes["keys"] = keys
        if owner is not None:
            changes["owner"] = _checked_owner(owner)
        if grace_seconds is not None:
            changes["grace_seconds"] = validate_seconds("grace_seconds", grace_seconds)
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------ per-kind answers

    def is_async(self, kind: str) -> bool:
        """Whether the handler of `kind` is a coroutine function (run on the loop)."""
        return kind in self.async_kinds

    def timeout_for(self, kind: str) -> float | None:
        """The time limit of one run of `kind`, if its policy sets one."""
        policy = self.policies.get(kind)
        return None if policy is None else policy.timeout

    def retries(self, kind: str, exc: BaseException) -> bool:
        """Whether a handler of `kind` that raised `exc` may be retried (`Policy.retry_on`)."""
        policy = self.policies.get(kind)
        return policy is None or policy.retries(exc)

    def retry_policy(self, kind: str) -> RetryPolicy | None:
        """The kind's backoff when its policy changes the spool's, else None."""
        return self.retry_policies.get(kind)

    def max_attempts_for(self, kind: str) -> int | None:
        """The kind's attempt cap when its policy sets one (the job's own still applies)."""
        policy = self.policies.get(kind)
        return None if policy is None else policy.max_attempts


def kind_backoff(policy: Policy, base_seconds: float, max_seconds: float) -> RetryPolicy | None:
    """A kind's backoff when its policy changes the spool's (`base_seconds`,
    `max_seconds`), else None: a field left None is the spool's, and the base is capped by
    the maximum (DESIGN §3). Fields compared with None: a backoff of 0 (retry at once) is
    the policy's own, not a missing one."""
    if policy.retry_base_seconds is None and policy.retry_max_seconds is None:
        return None
    cap = max_seconds if policy.retry_max_seconds is None else policy.retry_max_seconds
    base = base_seconds if policy.retry_base_seconds is None else policy.retry_base_seconds
    return RetryPolicy(min(base, cap), cap)


def _checked_owner(owner: object) -> str:
    """The lease owner a worker writes into every job it claims: checked at start, not at
    the first claim (a newline or a surrogate failed there, or in the metrics file)."""
    try:
        return validate_owner(owner)
    except InvalidJob as exc:
        raise ConfigError(f"owner: {exc}") from None


def _check_arity(kind: str, fn: Callable[..., Any]) -> None:
    """A handler is called `fn(job, ctx)`: one that cannot take that is refused at start
    (it failed every job of its kind, each attempt, with a TypeError)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to read (a builtin, some C callables): it is called anyway
    name = getattr(fn, "__qualname__", None) or repr(fn)
    try:
        signature.bind(None, None)
    except TypeError:
        raise ConfigError(f"handler for kind {kind!r} must take (job, ctx), but "
                          f"{name}{signature} cannot") from None
    # A `yield` left in a handler: its body never ran and each job was dead-lettered
    # ("result is a generator").
    call = getattr(fn, "__call__", None)  # noqa: B004 - generator callable objects
    if any(inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f) for f in (fn, call)):
        raise ConfigError(f"handler for kind {kind!r} is a generator function ({name} "
                          "yields): a handler returns its result; remove the yield")
