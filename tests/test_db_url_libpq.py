"""What a PostgreSQL ``--db`` URL means is what libpq reads in it: ``psycopg.conninfo.conninfo_to_dict`` (libpq's
own parser) is the reference, for what we accept and for what we show.

A table of URLs, each with what libpq reads, whether ``check_url`` accepts it,
and what ``shown_url`` shows; then the properties every URL of a generated
grid (passwords holding '@', ':', '/', '%', '?', '#', spaces and
percent-encodings; users, hosts and tails of every kind) must keep:

* a URL libpq cannot parse is refused (exit 2, libpq's reason, what to write)
  instead of failing at the connect (exit 1, "check that the server is
  running");
* a URL we accept is shown meaning what it means to libpq (its password
  alone masked: ``u:pa?ss@h/db?application_name=a@b`` was shown as ``u:***@b``,
  and the host 'h' in the driver's message as "***");
* no password, raw or percent-decoded, reaches the shown URL or a message
  (``u:pa#ss/wd@/db``, a Unix socket, was shown whole);
* a password cut short is refused in one wording (there were two).

Refused though libpq reads it: a password, then a database name holding an
'@' a host follows (``u:pw@h/db@x``, ``u:pw@h/a@b/c``); the same text is the
common mistake ``u:Kq7@Wx4/Zp9@127.0.0.1/db`` (a password holding '@' and '/'),
which would send a piece of the password to DNS as a host name. Written with
%40, such a database name passes.
"""

from __future__ import annotations

import itertools
from urllib.parse import unquote

import pytest
from psycopg.conninfo import conninfo_to_dict

from cli_run import cli, no_traceback
from factstream.store.database import DatabaseURLError, check_url, shown_url

CUT = ("holds a character that ends it early: percent-encode '/', '?' and '#' in the password (%2F, %3F, %23), "
       "and '@' as %40")


def libpq(url: str) -> dict[str, str] | str:
    """What libpq reads in ``url``, or its error (first line)."""
    try:
        return conninfo_to_dict(url)
    except Exception as err:  # noqa: BLE001 - psycopg.ProgrammingError
        return "error: " + str(err).splitlines()[0]


def ours(url: str) -> str:
    """"ok", or check_url's message."""
    try:
        check_url(url)
    except DatabaseURLError as err:
        return str(err)
    return "ok"


# (URL, what libpq reads (a dict, or the start of its error), accepted?, shown_url, or for a refused URL a piece of
# our message).
TABLE = [
    # the previous engineer's notes
    ("postgresql://u:pw@h/a@b/c", {"user": "u", "password": "pw", "host": "h", "dbname": "a@b/c"}, False, CUT),
    ("postgresql://u:pw@h/db@x", {"user": "u", "password": "pw", "host": "h", "dbname": "db@x"}, False, CUT),
    ("postgresql://u:pw@h/a%40b%2Fc", {"user": "u", "password": "pw", "host": "h", "dbname": "a@b/c"}, True,
     "postgresql://u:***@h/a%40b%2Fc"),
    ("postgresql://u:pw@h/db%40x", {"user": "u", "password": "pw", "host": "h", "dbname": "db@x"}, True,
     "postgresql://u:***@h/db%40x"),
    ("postgresql://u@h?x", 'error: missing key/value separator "="', False, "libpq cannot read postgresql://u@h?x"),
    ("postgresql://u@?host=/tmp", {"user": "u", "host": "/tmp"}, True, "postgresql://u@?host=/tmp"),
    ("postgresql://u@h?sslmode=disable", {"user": "u", "host": "h", "sslmode": "disable"}, True,
     "postgresql://u@h?sslmode=disable"),
    ("postgresql://u/x@h/db", {"host": "u", "dbname": "x@h/db"}, True, "postgresql://u/x@h/db"),
    ("postgresql://u@h/a@b/c", {"user": "u", "host": "h", "dbname": "a@b/c"}, True, "postgresql://u@h/a@b/c"),
    # a password libpq reads whole, shown as libpq reads the rest
    ("postgresql://u:Kq7?Wx4@h:5432/db?application_name=a@b",
     {"user": "u", "password": "Kq7?Wx4", "host": "h", "port": "5432", "dbname": "db", "application_name": "a@b"},
     True, "postgresql://u:***@h:5432/db?application_name=a@b"),
    ("postgresql://u:Kq7#Wx4@h/db?application_name=a@b",
     {"user": "u", "password": "Kq7#Wx4", "host": "h", "dbname": "db", "application_name": "a@b"},
     True, "postgresql://u:***@h/db?application_name=a@b"),
    ("postgresql://u:@h/db", {"user": "u", "host": "h", "dbname": "db"}, True, "postgresql://u:@h/db"),
    ("postgresql://u:pw@h/db?password=Kq7Wx4", {"user": "u", "password": "Kq7Wx4", "host": "h", "dbname": "db"},
     True, "postgresql://u:***@h/db?password=***"),
    # libpq cannot parse: refused before any connect
    ("postgresql://u:Kq7%zzWx4@h/db", "error: invalid percent-encoded token", False, "libpq cannot read"),
    ("postgresql://u:Kq7 Wx4@h/db", "error: unexpected spaces found", False, "use percent-encoded spaces (%20)"),
    ("postgresql://h/db?foo=bar", 'error: invalid URI query parameter: "foo"', False, "libpq cannot read"),
    # cut passwords: one wording ('@' had its own)
    ("postgresql://u:Kq7@Wx4@h/db", {"user": "u", "password": "Kq7", "host": "Wx4@h", "dbname": "db"}, False, CUT),
    ("postgresql://u:Kq7/Wx4@h/db", {"host": "u", "port": "Kq7", "dbname": "Wx4@h/db"}, False, CUT),
    ("postgresql://u:Kq7#Wx4/Zp9@/db", {"host": "u", "port": "Kq7#Wx4", "dbname": "Zp9@/db"}, False, CUT),
]


@pytest.mark.parametrize(("url", "reads", "accepted", "shown"), TABLE, ids=[row[0] for row in TABLE])
def test_the_table(url: str, reads: dict[str, str] | str, accepted: bool, shown: str) -> None:
    got = libpq(url)
    if isinstance(reads, str):
        assert isinstance(got, str) and got.startswith(reads), got
    else:
        assert got == reads, got
    said = ours(url)
    if accepted:
        assert said == "ok", said
        assert shown_url(url) == shown
    else:
        assert said != "ok" and shown in said, said
        assert "Kq7" not in said and "Wx4" not in said and "Zp9" not in said, said


# --- the grid ----------------------------------------------------------------------------------------------------

PASSWORDS = ["Kq7@Wx4", "Kq7:Wx4", "Kq7/Wx4", "Kq7%Wx4", "Kq7?Wx4", "Kq7#Wx4", "Kq7 Wx4", "Kq7%40Wx4", "Kq7%2FWx4",
             "Kq7%25Wx4", "Kq7%20Wx4", "Kq7%3FWx4", "Kq7%zzWx4", "Kq7@Wx4/Zp9", "Kq7/Wx4@Zp9", "Kq7?Wx4@Zp9",
             "Kq7#Wx4/Zp9", "Kq7:Wx4@Zp9", "Kq7?Wx4/Zp9", "Kq7/Wx4#Zp9", "Kq7@Wx4#Zp9", "Kq7Wx4Zp9"]
USERS = ["u", "", "u%40x"]
HOSTS = ["127.0.0.1", "h:5432", "[::1]:5432", "h1:5432,h2:5433", ""]
TAILS = ["", "/db", "/db?sslmode=disable", "?host=/tmp", "/db?application_name=a@b", "/a@b/c", "/db@x", "/db%40x"]
GRID = [(pw, f"postgresql://{user}:{pw}@{host}{tail}")
        for pw, user, host, tail in itertools.product(PASSWORDS, USERS, HOSTS, TAILS)]


def secrets(password: str, url: str) -> set[str]:
    """The password as written and decoded, its pieces of 3 characters (Kq7, Wx4, Zp9), and libpq's reading."""
    found = {password, unquote(password), *(p for p in ("Kq7", "Wx4", "Zp9") if p in password)}
    read = libpq(url)
    if isinstance(read, dict) and read.get("password"):
        found.add(read["password"])
    return found


@pytest.mark.parametrize(("password", "url"), GRID)
def test_every_url_agrees_with_libpq_and_shows_no_password(password: str, url: str) -> None:
    read = libpq(url)
    said = ours(url)
    shown = shown_url(url)
    for secret in secrets(password, url):
        assert secret not in shown and secret not in said, (secret, shown, said)
    if isinstance(read, str):  # libpq cannot parse it: neither do we
        assert said != "ok", (url, read)
        return
    if said != "ok":
        # refused though libpq parses it: only for a reason libpq's reading shows (a host holding '@', a port
        # that is no number), or the ambiguity of a password then a database name holding '@'
        ports = read.get("port", "").split(",")
        assert ("@" in read.get("host", "") or "?host=" in url  # a query's host= hid the authority's
                or not all(p == "" or p.isdigit() for p in ports)
                or ("password" in read and "@" in read.get("dbname", ""))), (url, read, said)
        assert CUT in said, said
        return
    # accepted: shown meaning what libpq reads, the password alone masked
    expected = dict(read)
    if "password" in expected:
        expected["password"] = "***"
    assert libpq(shown) == expected, (url, shown)


# --- the CLI ----------------------------------------------------------------------------------------------------


def one_line_exit_2(url: str, *words: str) -> str:
    out = cli("positions", "--db", url, "--db-timeout", "5")
    said = out.stdout + out.stderr
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, (out.returncode, said)
    assert out.stderr.startswith("factstream positions: ") and no_traceback(said), said
    for word in words:
        assert word in out.stderr, out.stderr
    return out.stderr


@pytest.mark.parametrize(("url", "words"), [
    # was exit 1, "cannot connect ... check that the server is running"
    ("postgresql://u@127.0.0.1:1?x", ['missing key/value separator "="', "<setting>=<value>"]),
    ("postgresql://u:Kq7%zzWx4@127.0.0.1:1/db", ["invalid percent-encoded token", "(%25, %20)", "u:***@127.0.0.1:1"]),
    ("postgresql://u:Kq7 Wx4@127.0.0.1:1/db", ["unexpected spaces", "u:***@127.0.0.1:1"]),
    ("postgresql://127.0.0.1:1/db?foo=bar", ['invalid URI query parameter: "foo"']),
    # was accepted: connected to 127.0.0.1 and said 'connection to server at "***", port *** failed'
    ("postgresql://u:Kq7Wx4@127.0.0.1:1/db@x", [CUT, "written %40 too"]),
    # one wording for both: an '@' had "holds an '@': write it percent-encoded, %40"
    ("postgresql://u:Kq7@Wx4@127.0.0.1:1/db", [CUT]),
    ("postgresql://u:Kq7/Wx4@127.0.0.1:1/db", [CUT]),
    # was shown whole: "the user name or password in postgresql://u:Kq7#Wx4/Zp9@/db holds ..."
    ("postgresql://u:Kq7#Wx4/Zp9@/db", [CUT, "postgresql://u:***@/db"]),
])
def test_the_cli_refuses_what_libpq_cannot_read_or_reads_two_ways(url: str, words: list[str]) -> None:
    said = one_line_exit_2(url, *words)
    for secret in ("Kq7", "Wx4", "Zp9"):
        assert secret not in said, said


@pytest.mark.postgres
def test_a_connect_failure_names_the_host_libpq_tried_and_masks_only_the_password() -> None:
    """u:Kq7?Wx4@127.0.0.1:1/db?application_name=a@b: before, "cannot connect to PostgreSQL at
    postgresql://u:***@b: connection to server at "***", port *** failed" (the host, port and query taken for
    pieces of a password ending at the query's '@')."""
    out = cli("positions", "--db", "postgresql://u:Kq7?Wx4@127.0.0.1:1/db?application_name=a@b", "--db-timeout", "5")
    said = out.stdout + out.stderr
    assert out.returncode == 1 and no_traceback(said), said
    assert "postgresql://u:***@127.0.0.1:1/db?application_name=a@b" in out.stderr, out.stderr
    assert 'server at "127.0.0.1", port 1 failed' in out.stderr, out.stderr
    assert "Kq7" not in said and "Wx4" not in said


@pytest.mark.postgres
def test_a_database_name_holding_an_encoded_at_reaches_the_server() -> None:
    """postgresql://postgres:pw@127.0.0.1:5432/db%40x: accepted, the server told of database "db@x"."""
    out = cli("positions", "--db", "postgresql://postgres:Kq7Wx4@127.0.0.1:5432/nosuch%40db", "--db-timeout", "5")
    said = out.stdout + out.stderr
    assert out.returncode == 1 and no_traceback(said), said
    assert 'database "nosuch@db" does not exist' in out.stderr, out.stderr
    assert "postgresql://postgres:***@127.0.0.1:5432/nosuch%40db" in out.stderr and "Kq7Wx4" not in said
