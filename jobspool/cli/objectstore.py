"""`--projection-option KEY=VALUE`: storage options for a projection on object storage (s3://...)."""

from __future__ import annotations

import argparse

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


def storage_options(args: argparse.Namespace, app_options: dict[str, str] | None = None
                    ) -> dict[str, str] | None:
    """The storage options a command runs with: the app's, overridden key by key by the flags."""
    given = dict(getattr(args, "projection_options", None) or [])
    merged = {**(app_options or {}), **given}
    return merged or None


def child_options(args: argparse.Namespace) -> list[str]:
    """The flags that hand the same storage options to a pool's child processes."""
    out: list[str] = []
    for key, value in getattr(args, "projection_options", None) or []:
        out += ["--projection-option", f"{key}={value}"]
    return out
