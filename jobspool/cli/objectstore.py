"""`--projection-option KEY=VALUE`: storage options for a projection on object storage (s3://...)."""

from __future__ import annotations

import argparse
import contextlib
import os

import orjson

from jobspool.projection.objectstore import CHECK_OPTION


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. aws_endpoint=http://host:8333)")
    return key.strip(), value


def add_projection_option(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable `--projection-option KEY=VALUE` to a command that takes `--projection`."""
    parser.add_argument(
        "--projection-option", dest="projection_options", action="append", type=_option, default=[],
        metavar="KEY=VALUE",
        help="a storage option of the projection's object store, repeatable (e.g. aws_endpoint=URL, "
        f"aws_region=R, allow_http=true; {CHECK_OPTION}=false skips the conditional-PUT check); "
        "default: the app's, and the AWS_* environment")


# How a pool's children get the supervisor's `--projection-option`s: by the environment,
# which only their user can read. On the command line, a secret key given there was in
# `ps` for every local user, for every child.
OPTIONS_ENV = "JOBSPOOL_POOL_PROJECTION_OPTIONS"
_INHERITED: list[list[tuple[str, str]]] = []  # read once, then out of the environment


def _inherited() -> list[tuple[str, str]]:
    """The options a pool supervisor handed this process (a pool child only), else none.
    Taken out of the environment, so that a process a handler starts does not inherit them."""
    if not _INHERITED:
        from jobspool.queue.poolchild import is_pool_child

        text = os.environ.pop(OPTIONS_ENV, None)
        pairs: list[tuple[str, str]] = []
        if text is not None and is_pool_child():
            with contextlib.suppress(ValueError, TypeError):
                pairs = [(str(k), str(v)) for k, v in orjson.loads(text)]
        _INHERITED.append(pairs)
    return _INHERITED[0]


def storage_options(args: argparse.Namespace, app_options: dict[str, str] | None = None
                    ) -> dict[str, str] | None:
    """The storage options a command runs with: the app's, overridden key by key by the flags
    (in a pool child, its supervisor's)."""
    from jobspool.projection.optionkeys import setting_of

    given = dict(_inherited() + list(getattr(args, "projection_options", None) or []))
    # By setting, not by name: a flag `endpoint=` beside the app's `aws_endpoint` left both
    # (LanceDB then took either), so the flag did not override.
    overridden = {setting_of(k) for k in given}
    kept = {k: v for k, v in (app_options or {}).items() if setting_of(k) not in overridden}
    merged = {**kept, **given}
    return merged or None


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment that hands the same storage options to a pool's child processes."""
    pairs = list(getattr(args, "projection_options", None) or [])
    return {OPTIONS_ENV: orjson.dumps(pairs).decode()} if pairs else {}
