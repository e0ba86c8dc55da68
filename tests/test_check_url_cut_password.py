"""A PostgreSQL URL whose password an unencoded '/' or '@' cuts short: told to percent-encode it, not about a port.

libpq ends the user name and password at the first '@' unless a '/' comes
first: with a '/' in the password, what precedes it is read as host and port
(``u:s3`` of ``postgresql://u:s3/cr?et@127.0.0.1/db``) and the rest as the
database name and query; with an '@' followed by '/', '?' or '#', the rest is
read as the host. Before: ``check_url`` said "bad host or port in ...: the
port in 'u:s3' must be a number 0-65535, got '***'" when a '?' or '#'
followed the '/' (showing a piece of the password), and let the other shapes
through to a connect that failed with "failed to resolve host 'u'" (exit 1)
or a query libpq could not parse. Now each is a usage error (exit 2, one
line) saying to percent-encode the password, never showing a piece of it. A
password holding only '?', '#' or ':' is read whole by libpq, and still
passes.
"""

from __future__ import annotations

import itertools

import pytest

from cli_run import cli, no_traceback
from factstream.store.database import DatabaseURLError, check_url

ENCODE = "percent-encode '/', '?' and '#' in the password (%2F, %3F, %23), and '@' as %40"
HOSTS = ("127.0.0.1", "127.0.0.1:5432", "[::1]:5432", "db.internal:5432,db2.internal:5433")
TAILS = ("/db", "/db?sslmode=disable", "")


def password(first: str, second: str) -> str:
    """A password of letters and digits found nowhere else in a URL or a message, cut by two characters."""
    return f"Kq7{first}Wx4{second}Zp9"


def pieces(secret: str) -> set[str]:
    """Every piece of ``secret`` of 3 characters or more."""
    return {secret[i:j] for i in range(len(secret)) for j in range(i + 3, len(secret) + 1)}


def shown_pieces(secret: str, text: str) -> list[str]:
    return sorted(p for p in pieces(secret) if p in text)


def cut_urls() -> list[tuple[str, str]]:
    """(password, URL) for every shape whose password libpq cuts short at a '/' or an '@' that '/', '?' or '#'
    follows; the separators: '/' first, or an '@' before a '/', '?' or '#'."""
    shapes = [(a, b) for a, b in itertools.product("/?#@:", repeat=2) if a == "/" or b == "/" or (a == "@" and b in "?#")]
    shapes += [("/", "")]
    out = []
    for (a, b), user, host, tail in itertools.product(shapes, ("u", ""), HOSTS, TAILS):
        # ('@', '/') with no tail: a password, or a database name holding '@' (u:pw@h/db@x), valid to libpq;
        # refused all the same (test_db_url_libpq), as with a tail
        secret = password(a, b)
        out.append((secret, f"postgresql://{user}:{secret}@{host}{tail}"))
    return out


@pytest.mark.parametrize(("secret", "url"), cut_urls())
def test_check_url_says_to_percent_encode_a_cut_password(secret: str, url: str) -> None:
    with pytest.raises(DatabaseURLError) as caught:
        check_url(url)
    said = str(caught.value)
    assert ENCODE in said and "port in" not in said and "bad host" not in said, said
    assert not shown_pieces(secret, said), (shown_pieces(secret, said), said)
    assert ":***@" in said, said


@pytest.mark.parametrize(("a", "b"), [(a, b) for a, b in itertools.product("?#:", repeat=2)])
def test_a_password_libpq_reads_whole_still_passes(a: str, b: str) -> None:
    """'?', '#' and ':' do not end a password for libpq: such a URL connects as written."""
    for host, tail in itertools.product(HOSTS, TAILS):
        assert check_url(f"postgresql://u:{password(a, b)}@{host}{tail}") == "postgres"


@pytest.mark.parametrize("url", [
    "postgresql://u:pw@h/db%40x",                   # a database name holding '@', written %40: read one way
    "postgresql://u:pw@h:5432/db%40x?sslmode=disable",
    "postgresql://h/db?application_name=a@b",        # an '@' in a setting of the query
    "postgresql://u:pw@h/db?application_name=a@b",
    "postgresql://u:Kq7%2FWx4%3FZp9@127.0.0.1/db",  # percent-encoded as the message says
    "postgresql:///db?host=/var/run/postgresql",
])
def test_urls_that_are_no_cut_password_pass(url: str) -> None:
    assert check_url(url) == "postgres"


@pytest.mark.parametrize("url, secret", [
    ("postgresql://u:s3/cr?et@127.0.0.1/db", "s3/cr?et"),  # the report's shape: "the port in 'u:s3'"
    ("postgresql://postgres:Kq7/Wx4#Zp9@127.0.0.1:5432/db", "Kq7/Wx4#Zp9"),  # "the port in ..." too
    ("postgresql://postgres:Kq7/Wx4Zp9@127.0.0.1:1/db", "Kq7/Wx4Zp9"),  # was exit 1: "failed to resolve host"
    ("postgresql://postgres:1234/5678?9@127.0.0.1:1/db", "1234/5678?9"),  # was exit 1: libpq's query error
    ("postgresql://postgres:Kq7@Wx4?Zp9@127.0.0.1:1/db", "Kq7@Wx4?Zp9"),  # was exit 1: libpq's query error
    ("postgresql://:Kq7@Wx4#Zp9@127.0.0.1:1/db", "Kq7@Wx4#Zp9"),  # was exit 1: "failed to resolve host '***#***'"
])
@pytest.mark.parametrize("command", [["positions"], ["serve", "--port", "0"], ["tail", "127.0.0.1:1"],
                                     ["synapse", "check"]])
def test_the_cli_refuses_a_cut_password_in_one_line(url: str, secret: str, command: list[str]) -> None:
    out = cli(*command, "--db", url, "--db-timeout", "5") if command == ["positions"] else cli(*command, "--db", url)
    said = out.stdout + out.stderr
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, (out.returncode, said)
    assert out.stderr.startswith(f"factstream {' '.join(command[:2] if command[0] == 'synapse' else command[:1])}: ")
    assert "percent-encode" in out.stderr and "port in" not in out.stderr, out.stderr
    assert ENCODE in out.stderr, out.stderr  # synapse check too: its own older wording is gone
    assert not shown_pieces(secret, said) and "'u:s3'" not in said, (shown_pieces(secret, said), said)
    assert no_traceback(said), said
