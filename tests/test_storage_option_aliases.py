"""Storage options that name one setting twice (aliases, or two cases) are resolved
before LanceDB sees them: it takes a map, and of two spellings given different values
one won at random per process (an app's `aws_endpoint` beside a flag's `endpoint`: some
processes wrote to each, and the conditional-PUT check tested the other)."""

from __future__ import annotations

import argparse

import pytest

from jobspool.cli.objectstore import storage_options
from jobspool.errors import ConfigError
from jobspool.projection.objectstore import check_storage_options, s3_target


@pytest.mark.parametrize("first, second", [("aws_endpoint", "endpoint"),
                                           ("endpoint_url", "AWS_ENDPOINT"),
                                           ("aws_region", "REGION")])
def test_one_setting_under_two_names_with_different_values_is_refused(first: str,
                                                                        second: str) -> None:
    with pytest.raises(ConfigError, match=f"{first!r} and {second!r} both set"):
        check_storage_options({first: "http://a:1", second: "http://b:2", "allow_http": "1"})


def test_one_setting_under_two_names_with_one_value_is_kept_once() -> None:
    got = check_storage_options({"aws_endpoint": "http://a:1", "endpoint": "http://a:1",
                                 "allow_http": "true"})
    assert got == {"aws_endpoint": "http://a:1", "allow_http": "true"}


def test_a_flag_overrides_the_app_s_setting_whatever_its_spelling() -> None:
    args = argparse.Namespace(projection_options=[("endpoint", "http://flag:1")])
    got = storage_options(args, {"aws_endpoint": "http://app:1", "allow_http": "true"})
    assert got == {"allow_http": "true", "endpoint": "http://flag:1"}


def test_two_endpoints_in_the_environment_are_refused_unless_an_option_names_one() -> None:
    env = {"AWS_ENDPOINT": "http://a:1", "AWS_ENDPOINT_URL": "http://b:2"}
    with pytest.raises(ConfigError, match="two S3 endpoints"):
        s3_target("s3://bucket/p", {}, env)
    target = s3_target("s3://bucket/p", {"endpoint": "http://c:3"}, env)
    assert target is not None and target.endpoint == "http://c:3"
    same = s3_target("s3://bucket/p", {}, {"AWS_ENDPOINT": "http://a:1",
                                           "AWS_ENDPOINT_URL": "http://a:1"})
    assert same is not None and same.endpoint == "http://a:1"


def test_a_region_beside_a_different_default_region_is_taken() -> None:
    """object_store takes a default region only where no region is given, so the two agree
    whatever their values (as AWS_REGION and AWS_DEFAULT_REGION often differ)."""
    got = check_storage_options({"aws_region": "us-east-1", "aws_default_region": "eu-west-1"})
    assert got == {"aws_region": "us-east-1", "aws_default_region": "eu-west-1"}
