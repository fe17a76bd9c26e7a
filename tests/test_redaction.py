"""A database password never reaches a message, a log line or a report (README: "one line
naming the server (never its password)"); a URL typed with a stray space is refused, not
taken for a directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from jobspool.urls import redact_url, scrub_password
from tests.cli_harness import run_cli


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
    ("postgresql://h/app?user=u&password=sec&sslmode=disable",
     "postgresql://h/app?user=u&password=***&sslmode=disable"),
    ("postgres://h/app?PASSWORD=x", "postgres://h/app?PASSWORD=***"),
    ("postgresql://u@h:5/db?options=-csearch_path%3Dq", "postgresql://u@h:5/db?options=-csearch_path%3Dq"),
    ("/var/spool/jobs", "/var/spool/jobs"),
    # Found in a PostgreSQL pass: an unencoded '@' in the password showed its second half.
    ("postgresql://pwuser:Tops@cret@127.0.0.1:5/postgres", "postgresql://pwuser:***@127.0.0.1:5/postgres"),
    ("host=h port=5 user=u password=KvPw", "host=h port=5 user=u password=***"),
    ("host=h password='a b' dbname=d", "host=h password=*** dbname=d"),
])
def test_redact_url_hides_the_password_in_either_form(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_query_password_appears_in_no_output_of_a_run(pg_url: str) -> None:
    """The server trusts every password: the run goes through, and nothing it prints —
    the JSON start line included — holds the secret."""
    url = pg_url + "&password=S3CRET-VALUE"
    outputs = [run_cli("init", root=url), run_cli("enqueue", "work", root=url),
               run_cli("run-until-idle", "--app", "tests.apps.simple:app", "--log-format",
                       "json", "--log-level", "info", root=url),
               run_cli("health", "--json", root=url), run_cli("stats", "--json", root=url)]
    for code, out, err in outputs:
        assert code in (0, 2), err
        assert "S3CRET" not in out + err
    parts = urlsplit(pg_url)
    bad = urlunsplit(parts._replace(  # a port nothing listens on (one past 65535 is bad input)
        netloc=f"nobody:S3CRET@{parts.hostname}:1"))
    code, _, err = run_cli("stats", root=bad)
    assert code == 2 and "S3CRET" not in err and "***" in err


def test_a_url_with_leading_whitespace_is_refused_and_nothing_is_created(
        tmp_path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, _, err = run_cli("init", root=" postgresql://u@127.0.0.1:1/db")
    finally:
        os.chdir(cwd)
    assert code == 1 and "whitespace" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("root", ["host=127.0.0.1 port=1 user=u password=KvPw",
                                  "postgressql://u:Se@cret@127.0.0.1:1/db"])
def test_a_root_that_is_no_spool_is_refused_without_its_password(
        tmp_path: Path, root: str) -> None:
    # Found in a PostgreSQL pass: libpq's key=value form was taken for a directory (init
    # made one named after it, password and all; errors printed it), and a mistyped
    # scheme echoed the password.
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for command in ("init", "stats"):
            code, out, err = run_cli(command, root=root)
            assert code == 1 and len(err.strip().splitlines()) == 1, err
            assert "KvPw" not in out + err and "cret" not in out + err, err
    finally:
        os.chdir(cwd)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("password", "leaked"), [
    ("s3cr%tPassw0rd", "s3cr%tPassw0rd"),  # psycopg quoted the token it could not decode
    ("s3cr@tPassw0rd", "tPassw0rd"),  # libpq cut at the first '@': the rest became the host
])
def test_a_misformed_password_is_not_echoed_by_the_drivers_error(
        password: str, leaked: str) -> None:
    code, out, err = run_cli("stats", root=f"postgresql://alice:{password}@127.0.0.1:1/db")
    assert code in (1, 2) and len(err.strip().splitlines()) == 1, err
    assert leaked not in out + err and "***" in err, err


def test_demo_on_postgresql_prints_no_password(pg_url: str) -> None:
    url = pg_url + "&password=S3CRET-VALUE"
    code, out, err = run_cli("demo", "--jobs", "60", root=url)
    assert code == 0, err
    assert "S3CRET" not in out + err and "password=***" in out


@pytest.mark.parametrize("url", [
    "postgresql://postgres:hunter2@abc@127.0.0.1:1/postgres",
    "postgresql://postgres:hunter2@abcd@127.0.0.1:1/postgres?sslmode=disable",
])
def test_an_unencoded_at_in_the_password_is_refused_without_showing_any_of_it(
        url: str) -> None:
    # Found by a CLI fuzz: libpq split at the first '@', and "failed to resolve host
    # 'abc@127.0.0.1'" printed the part of the password after it (pieces under 4
    # characters were not scrubbed), in stderr and in a worker's log.
    for args in (("stats",), ("enqueue", "work"), ("run-until-idle", "--app",
                                                    "tests.apps.simple:app")):
        r = run_cli(*args, root=url)
        assert r.code == 1, (args, r)
        line = r.err.strip()
        assert len(line.splitlines()) == 1 and "%40" in line
        assert "hunter2" not in line and "abc" not in line, line


@pytest.mark.parametrize(("root", "shown", "says"), [
    # Found by a CLI fuzz: once a Path, `file:///tmp/x` was shown as `file://tmp/x`.
    ("file:///tmp/x", "'file:///tmp/x'", "is a file:// URL"),
    ("s3://bucket/q", "'s3://bucket/q'", "is a s3:// URL"),
    # libpq takes the scheme in lower case only: say so rather than "not a postgresql URL".
    ("POSTGRESQL://u:KvPw@127.0.0.1:1/db", "'POSTGRESQL://u:***@127.0.0.1:1/db'",
     "write the scheme in lower case (postgresql://)"),
    # A slash missing: it said "write the scheme in lower case" and showed the URL fixed.
    ("postgresql:/u:KvPw@127.0.0.1:1/db", "'postgresql:/u:***@127.0.0.1:1/db'",
     "two slashes after its scheme, in lower case (postgresql://...)"),
    ("PostgreSQL:/u:KvPw@127.0.0.1:1/db", "'PostgreSQL:/u:***@127.0.0.1:1/db'",
     "two slashes after its scheme, in lower case (postgresql://...)"),
    # Both slashes missing: taken for a path, a directory named after it, password and all.
    ("postgresql:u:KvPw@127.0.0.1:1/db", "'postgresql://u:***@127.0.0.1:1/db'",
     "two slashes after its scheme (postgresql://..."),
])
def test_a_url_root_of_another_kind_is_named_as_typed(tmp_path: Path, root: str, shown: str,
                                                      says: str) -> None:
    from jobspool import Spool
    from jobspool.errors import SpoolError

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, out, err = run_cli("stats", root=root)
        with pytest.raises(SpoolError) as raised:
            Spool(root)
    finally:
        os.chdir(cwd)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert shown in err and says in err and "KvPw" not in out + err, err
    assert shown in str(raised.value) and says in str(raised.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("password", ["se/cretword", "abc?defghij", "abc#defghij", "p@ss/word",
                                      "p@ss/w?rd#1"])
def test_a_password_with_an_unencoded_slash_question_or_hash_is_refused_unshown(
        password: str) -> None:
    # Found by an operator-slips probe: the password pattern stopped at the first '/?#' and
    # the whole password was shown ("cannot connect to postgresql://app:se/cretword@..."),
    # or its first letter taken for it and every "p" of the message blanked.
    r = run_cli("list", root=f"postgresql://app:{password}@127.0.0.1:1/postgres")
    assert r.code == 1, r
    line = r.err.strip()
    assert len(line.splitlines()) == 1 and password not in line, line
    assert re.findall(r"postgresql://\S+", line) == ["postgresql://app:***@127.0.0.1:1/postgres:"]
    rest = line.replace("postgresql://app:***@127.0.0.1:1/postgres:", "")
    assert "postgresql" not in rest and "127.0.0.1" not in rest, line  # no other URL shown


def test_a_short_password_is_hidden_where_it_stands_and_nowhere_else() -> None:
    # A one-letter password blanked every such letter of a message: "cannot e***ecute".
    url = "postgresql://rotx:x@127.0.0.1:1/db"
    said = scrub_password(f"cannot execute INSERT in a read-only transaction ({url})", url)
    assert said == ("cannot execute INSERT in a read-only transaction "
                    "(postgresql://rotx:***@127.0.0.1:1/db)")


@pytest.mark.parametrize("url", [
    "postgresql://postgres:a%z@127.0.0.1:1/postgres",  # a short password libpq quotes back
    "postgresql://h/app?password=a%z",
    "postgresql:///u:s3cretpw@h/db",  # a third slash typed: the pattern missed it whole
])
def test_a_misformed_url_shows_none_of_its_password(url: str) -> None:
    secret = "a%z" if "a%z" in url else "s3cretpw"
    r = run_cli("stats", root=url)
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1, r
    assert secret not in r.err and "***" in r.err, r.err


@pytest.mark.parametrize("url", [
    "postgresql://u@127.0.0.1:1/db?application_name=a@b",
    "postgresql://u@127.0.0.1:1/db?sslrootcert=/etc/ssl/a@b.pem",
])
def test_an_at_in_a_query_value_is_libpqs_to_read(url: str) -> None:
    # Refused as a misplaced password: libpq reads these (a regression probe).
    r = run_cli("stats", root=url)
    assert r.code == 2 and "cannot connect" in r.err and "percent-encode" not in r.err, r.err


@pytest.mark.parametrize(("url", "message", "kept"), [
    ("postgresql://u@h:1/postgres?password=x&dbname=orders_db",
     'FATAL: database "orders_db" does not exist', "orders_db"),
    ("postgresql://u@h:1/postgres?password=x&user=nosuchrole",
     'FATAL: role "nosuchrole" does not exist', "nosuchrole"),
    ("postgresql://u@h:1/postgres?password=s3cretpw&host=dbhost.example",
     'connection to server at "dbhost.example", port 1 failed', "dbhost.example"),
])
def test_a_query_password_hides_itself_not_the_parameters_after_it(
        url: str, message: str, kept: str) -> None:
    # The keyword form's pattern (`password=...` up to a space) took the rest of the
    # query for the password: the database, role or host the error was about showed "***".
    said = scrub_password(message, url)
    assert kept in said, said
    secret = url.split("password=")[1].split("&")[0]
    shown = scrub_password(f"{message}; password={secret} given", url)
    assert f"password={secret}" not in shown and "password=***" in shown, shown
