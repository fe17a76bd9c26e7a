"""The projection on object storage: storage options, the conditional-PUT check, commit retries.

LanceDB commits a new table version on `s3://` with a create-only PUT
(`If-None-Match: *`) and retries on 412: no lock is needed, as long as the
endpoint honours the condition. One that ignores it answers 200 and lets
two concurrent commits write the same manifest: one of them is lost with no
error (measured: an endpoint like that lost 18 of 40 commits). So, once per
process and endpoint, before the first use of an `s3://` projection,
`check_conditional_put` writes a probe object twice, the second time
create-only, and refuses the endpoint unless the second PUT is refused.

Opt-out (an endpoint known to be safe that the probe cannot reach, or
commits through DynamoDB, `s3+ddb://`, which never need it): the storage
option `jobspool_check_conditional_put=false` or the environment variable
`JOBSPOOL_S3_CHECK_CONDITIONAL_PUT=0`.

The probe is one small signed request (AWS Signature V4 with hashlib/hmac;
no boto3): its settings come from the same storage options and `AWS_*`
environment LanceDB reads (endpoint, keys, region, allow_http).

Commits are retried here, bounded (`retry_transient`), when the error says
the outcome is unknown, the store throttled (503, SlowDown) or the request
timed out: the fenced merge makes a repeat harmless. A commit that still
fails fails its batch; nothing is reported written that did not land.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import http.client
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, urlsplit

from jobspool.errors import ConditionalPutUnsupported as ConditionalPutUnsupported
from jobspool.errors import ConfigError, ProjectionError
from jobspool.errors import ObjectStoreUnreachable as ObjectStoreUnreachable
from jobspool.projection.optionkeys import misspelt, setting_of

log = logging.getLogger("jobspool.projection.objectstore")
T = TypeVar("T")

#: Storage option (ours, never passed to LanceDB) that turns the conditional-PUT check off.
CHECK_OPTION = "jobspool_check_conditional_put"
#: Environment variable that turns the check off (`0`, `false`, `no`, `off`).
CHECK_ENV = "JOBSPOOL_S3_CHECK_CONDITIONAL_PUT"
_OURS = (CHECK_OPTION,)
_FALSE = {"0", "false", "no", "off"}


_ENDPOINT_KEYS = ("aws_endpoint", "aws_endpoint_url", "endpoint", "endpoint_url")
_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")


def check_storage_options(options: Mapping[str, str] | None) -> dict[str, str] | None:
    """Validate storage options: a mapping of non-empty string keys to string values (or None)."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise ConfigError(f"storage_options must be a mapping of str -> str, got {type(options).__name__}")
    out: dict[str, str] = {}
    for k, v in options.items():
        if not isinstance(k, str) or not k:
            raise ConfigError(f"storage option name {k!r} must be a non-empty string")
        if not isinstance(v, str):
            raise ConfigError(f"storage option {k!r} must be a string, got {type(v).__name__} {v!r}")
        if (meant := misspelt(k)) is not None:
            raise ConfigError(f"unknown storage option {k!r}: did you mean {meant!r}? (LanceDB "
                              "ignores names it does not know)")
        out[k] = v
    out = _one_per_setting(out)
    endpoint = _lookup(out, {}, _ENDPOINT_KEYS, ())  # given here (the environment's: as-is)
    allow = _lookup(out, os.environ, ("allow_http", "aws_allow_http"), ("AWS_ALLOW_HTTP",))
    if endpoint and endpoint.lower().startswith("http://") and (allow or "").lower() not in (
            "1", "true", "yes", "on"):
        raise ConfigError(f"the endpoint {endpoint} is plain http: add the storage option "
                          "allow_http=true (LanceDB refuses http endpoints without it)")
    return out


def _one_per_setting(options: dict[str, str]) -> dict[str, str]:
    """Each setting under one name: two spellings of one setting (`endpoint` and
    `aws_endpoint`, or two cases) with different values are refused, since LanceDB takes
    one of them at random per process; with the same value, the first is kept."""
    seen: dict[str, str] = {}
    out: dict[str, str] = {}
    for k, v in options.items():
        setting = setting_of(k)
        if setting in seen:
            if options[seen[setting]] != v:
                raise ConfigError(f"storage options {seen[setting]!r} and {k!r} both set the "
                                  f"{setting}, to different values ({options[seen[setting]]!r}"
                                  f" and {v!r}); give it once (LanceDB would take either)")
            continue
        seen[setting] = k
        out[k] = v
    return out


def lance_options(options: Mapping[str, str] | None) -> dict[str, str] | None:
    """The storage options to hand LanceDB: ours (`jobspool_*`) removed; None when none are left."""
    if not options:
        return None
    out = {k: v for k, v in options.items() if k.lower() not in _OURS}
    return out or None


def scheme_of(uri: str | None) -> str:
    """The URI's scheme in lower case ('' for a local path)."""
    if not uri or "://" not in uri:
        return ""
    return uri.split("://", 1)[0].lower()


def is_object_store(uri: str | None) -> bool:
    """Whether `uri` names object storage (s3://, gs://, az://...) rather than a local directory."""
    return scheme_of(uri) not in ("", "file")


def local_path(uri: str) -> str | None:
    """The directory a local projection URI names (a path, or `file://...`); None for
    object storage."""
    # `~` expanded as LanceDB expands it: read as written, `projection="~/idx"` was
    # checked (inside the spool? there?) at a literal `~` while the tables went to $HOME.
    return None if is_object_store(uri) else os.path.expanduser(uri.removeprefix("file://"))


# --- settings, as LanceDB (object_store) reads them: options first, then AWS_* variables


def _lookup(options: Mapping[str, str], env: Mapping[str, str], names: tuple[str, ...],
            env_names: tuple[str, ...]) -> str | None:
    lowered = {k.lower(): v for k, v in options.items()}
    for n in names:
        if lowered.get(n):
            return lowered[n]
    for n in env_names:
        if env.get(n):
            return env[n]
    return None


@dataclass(frozen=True)
class S3Target:
    """Where and as whom the probe talks: endpoint URL, bucket, key prefix, region, keys."""

    endpoint: str
    bucket: str
    prefix: str
    region: str
    access_key: str | None
    secret_key: str | None
    session_token: str | None = None
    virtual_hosted: bool = False


def s3_target(uri: str, options: Mapping[str, str] | None = None,
              env: Mapping[str, str] | None = None) -> S3Target | None:
    """Resolve an `s3://bucket/prefix` URI against its storage options and the `AWS_*` environment.

    Returns None when no endpoint is configured: that is AWS S3 itself, which
    honours create-only PUTs (since 2024), so there is nothing to check.
    """
    opts = dict(options or {})
    env = os.environ if env is None else env
    parts = urlsplit(uri)
    region = _lookup(opts, env, ("aws_region", "region"), ("AWS_REGION", "AWS_DEFAULT_REGION")) or "us-east-1"
    endpoint = _lookup(opts, env, _ENDPOINT_KEYS, _ENDPOINT_ENV)
    if endpoint is None:
        return None
    if _lookup(opts, {}, _ENDPOINT_KEYS, ()) is None:
        # From the environment: two of its names with different values, and LanceDB was
        # seen writing to one while this check tested the other.
        named = {n: env[n] for n in _ENDPOINT_ENV if env.get(n)}
        if len(set(named.values())) > 1:
            raise ConfigError("the environment names two S3 endpoints (" + ", ".join(
                f"{n}={v}" for n, v in named.items()) + "): LanceDB may write to either; "
                "set one, or give the endpoint as a storage option")
    if "://" not in endpoint:
        endpoint = "https://" + endpoint
    vhost = _lookup(opts, env, ("aws_virtual_hosted_style_request", "virtual_hosted_style_request"),
                    ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST",))
    return S3Target(
        endpoint=endpoint.rstrip("/"),
        bucket=parts.netloc,
        prefix=parts.path.strip("/"),
        region=region,
        access_key=_lookup(opts, env, ("aws_access_key_id", "access_key_id"), ("AWS_ACCESS_KEY_ID",)),
        secret_key=_lookup(opts, env, ("aws_secret_access_key", "secret_access_key"),
                           ("AWS_SECRET_ACCESS_KEY",)),
        session_token=_lookup(opts, env, ("aws_session_token", "session_token", "token"),
                              ("AWS_SESSION_TOKEN",)),
        virtual_hosted=(vhost or "").lower() in ("1", "true", "yes"),
    )


# --- one signed request (AWS Signature Version 4)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def s3_request(target: S3Target, method: str, key: str, body: bytes = b"",
               headers: Mapping[str, str] | None = None, *, timeout: float = 10.0,
               now: dt.datetime | None = None) -> tuple[int, bytes]:
    """Send one SigV4-signed request for object `key` of the target's bucket; return (status, body).

    `key` "" addresses the bucket itself. Raises OSError when the endpoint
    cannot be reached (connection refused, timeout).
    """
    ep = urlsplit(target.endpoint)
    host = ep.netloc
    if target.virtual_hosted:
        host = f"{target.bucket}.{host}"
        path = "/" + key
    else:
        path = f"/{target.bucket}" + (f"/{key}" if key else "")
    path = (ep.path.rstrip("/") + path) or "/"
    when = now or dt.datetime.now(dt.UTC)
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    payload = hashlib.sha256(body).hexdigest()
    hdrs = {"host": host, "x-amz-date": amz_date, "x-amz-content-sha256": payload}
    hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
    if target.session_token:
        hdrs["x-amz-security-token"] = target.session_token
    quoted = quote(path, safe="/-_.~")
    if target.access_key and target.secret_key:
        signed = sorted(hdrs)
        canonical = "\n".join([method, quoted, "", "".join(f"{k}:{hdrs[k].strip()}\n" for k in signed),
                               ";".join(signed), payload])
        scope = f"{amz_date[:8]}/{target.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        k = _hmac(("AWS4" + target.secret_key).encode(), amz_date[:8])
        for part in (target.region, "s3", "aws4_request"):
            k = _hmac(k, part)
        signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        hdrs["authorization"] = (f"AWS4-HMAC-SHA256 Credential={target.access_key}/{scope}, "
                                 f"SignedHeaders={';'.join(signed)}, Signature={signature}")
    conn_cls = http.client.HTTPSConnection if ep.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(host, timeout=timeout)
    try:
        conn.request(method, quoted, body=body if body or method == "PUT" else None, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --- the check, once per process and endpoint


_CHECKED: set[tuple[str, str]] = set()
_CHECK_LOCK = threading.Lock()


def check_wanted(options: Mapping[str, str] | None, env: Mapping[str, str] | None = None) -> bool:
    """Whether the conditional-PUT check is on (it is unless opted out by option or environment)."""
    env = os.environ if env is None else env
    lowered = {k.lower(): v for k, v in (options or {}).items()}
    if lowered.get(CHECK_OPTION, "").strip().lower() in _FALSE:
        return False
    return env.get(CHECK_ENV, "").strip().lower() not in _FALSE


def check_conditional_put(uri: str, options: Mapping[str, str] | None = None, *,
                          timeout: float = 10.0) -> None:
    """Refuse an `s3://` endpoint that overwrites an existing object on a create-only PUT.

    Once per process per (endpoint, bucket): a success is remembered, a
    failure is not (the next use checks again). Other schemes, AWS S3 itself
    (no endpoint configured) and an opt-out (see the module docstring) are
    not checked. Raises `ConditionalPutUnsupported` (one line naming the risk)
    or `ObjectStoreUnreachable` when the probe could not get an answer.
    """
    if scheme_of(uri) != "s3" or not check_wanted(options):
        return
    target = s3_target(uri, options)
    if target is None:
        return
    slot = (target.endpoint, target.bucket)
    with _CHECK_LOCK:
        if slot in _CHECKED:
            return
    where = f"endpoint {target.endpoint} (bucket {target.bucket!r})"
    if not (target.access_key and target.secret_key):
        raise ConditionalPutUnsupported(
            f"cannot check that {where} honours conditional PUTs: no access key in the storage "
            f"options or AWS_* environment; pass them, or opt out with {CHECK_OPTION}=false")
    key = "/".join(p for p in (target.prefix, f".jobspool-put-check-{uuid.uuid4().hex}") if p)
    try:
        first, detail = s3_request(target, "PUT", key, b"1", timeout=timeout)
        if first // 100 != 2:
            raise ConditionalPutUnsupported(
                f"cannot check that {where} honours conditional PUTs: a plain PUT of {key!r} got "
                f"HTTP {first} ({_snippet(detail)}); fix access, or opt out with {CHECK_OPTION}=false")
        second, detail = s3_request(target, "PUT", key, b"2", {"If-None-Match": "*"}, timeout=timeout)
        with contextlib.suppress(OSError):  # a leftover probe object is harmless
            s3_request(target, "DELETE", key, timeout=timeout)
    except OSError as exc:
        raise ObjectStoreUnreachable(f"cannot reach {where} to check conditional PUTs: "
                                     f"{type(exc).__name__}: {exc}") from exc
    if second in (409, 412):  # 412 Precondition Failed; AWS may say 409 on a racing create
        with _CHECK_LOCK:
            _CHECKED.add(slot)
        log.debug("%s refuses overwriting create-only PUTs (HTTP %d)", where, second)
        return
    if second // 100 == 2:
        raise ConditionalPutUnsupported(
            f"{where} ignores conditional PUTs (If-None-Match: * overwrote an existing object); "
            f"concurrent LanceDB commits would be lost (opt out only if you know better: "
            f"{CHECK_OPTION}=false)")
    raise ConditionalPutUnsupported(
        f"{where} answered HTTP {second} to a create-only PUT ({_snippet(detail)}), not 412: "
        f"concurrent LanceDB commits there are not known to be safe (opt out: {CHECK_OPTION}=false)")


def _snippet(body: bytes) -> str:
    return " ".join(body.decode("utf-8", "replace").split())[:120] or "no body"


def forget_checks() -> None:
    """Forget which endpoints passed the check (tests; a process that moved its endpoint)."""
    with _CHECK_LOCK:
        _CHECKED.clear()


# --- bounded retries of commits whose outcome is unknown


_TRANSIENT = (
    # lance 13 says "... is unknown: the commit may or may not have been applied" and
    # "... treating the commit status as unknown"
    "result unknown", "is unknown", "status as unknown", "may or may not have been applied",
    "slowdown", "slow down", "service unavailable", "throttl", "too many requests",
    "timed out", "timeout", "connection refused", "connection reset", "connection closed",
    "broken pipe", "error sending request", "temporarily unavailable", "internalerror", " 503", " 500",
    " 429", "dispatch failure",
)


def is_transient(exc: BaseException) -> bool:
    """Whether a LanceDB/object-store error may pass if the same commit is tried again."""
    if isinstance(exc, ProjectionError):
        return False  # ours: a schema clash, a refused endpoint — not the network
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    text = f" {exc}".lower()
    return any(marker in text for marker in _TRANSIENT)


@dataclass(frozen=True)
class CommitRetry:
    """Bounded exponential backoff for commits: `attempts` tries, delays base*2^n (capped), jittered.

    The whole retry stays within `budget` seconds of sleeping, so a batch's
    leases (extended by a third of their length before the merge) outlive it.
    """

    attempts: int = 5
    base_seconds: float = 0.1
    max_seconds: float = 2.0
    budget: float = 5.0

    def delays(self, rand: Callable[[], float] = random.random) -> list[float]:
        """The sleeps between tries (one fewer than `attempts`), full-jittered, within `budget`."""
        out: list[float] = []
        spent = 0.0
        for n in range(max(self.attempts - 1, 0)):
            d = min(self.max_seconds, self.base_seconds * 2**n) * (0.5 + rand() / 2)
            if spent + d > self.budget:
                break
            spent += d
            out.append(d)
        return out


def retry_transient(fn: Callable[[], T], policy: CommitRetry, *, what: str = "commit",
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """Call `fn`; on a transient error, wait and call it again, as `policy` bounds. Else raise."""
    delays = policy.delays()
    for n in range(len(delays) + 1):
        try:
            return fn()
        except Exception as exc:
            if n == len(delays) or not is_transient(exc):
                raise
            log.info("%s failed (%s: %s); retry %d/%d in %.2fs", what, type(exc).__name__,
                     " ".join(str(exc).split())[:200], n + 1, len(delays), delays[n])
            sleep(delays[n])
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = [
    "CHECK_ENV",
    "CHECK_OPTION",
    "CommitRetry",
    "ConditionalPutUnsupported",
    "ObjectStoreUnreachable",
    "S3Target",
    "check_conditional_put",
    "check_storage_options",
    "check_wanted",
    "forget_checks",
    "is_object_store",
    "is_transient",
    "lance_options",
    "retry_transient",
    "s3_request",
    "s3_target",
]
