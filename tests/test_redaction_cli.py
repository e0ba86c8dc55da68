"""No part of a password reaches a user through the installed ``factstream``, whatever characters it holds.

A password holding '/' and then '?' or '#' (``u:pa/ss?wd@host``) is cut by a
URL parser at the '/': the URL was printed whole, and a message could quote a
piece of it (the "port" ``pa``, the "query" ``wd@host``). Each command below is
given such a URL where nothing listens (or that no parser accepts), fails with
one line, and must show none of the password's pieces of 3+ characters.
"""

from __future__ import annotations

import re

import pytest
from cli_run import cli, free_port, no_traceback

from factstream.redaction import MASK

pytestmark = pytest.mark.timeout(300)

#: Pieces no message contains by chance; the second password starts with digits, so that a URL parser reads
#: host 'u', port 48213 and a query holding '@': libpq then refuses the URL and quotes that query.
LETTERS = "Qz7kq/Wv9xw?Jm4pj"
HASHED = "Qz7kq/Wv9xw#Jm4pj"
DIGITS = "48213/Wv9xw?Jm4pj"


def _pieces(password: str) -> list[str]:
    """The password and each of its pieces between special characters, of 3+ characters."""
    return [password, *(p for p in re.split(r"[/?#@:]", password) if len(p) >= 3)]


def _fails_masked(password: str, *args: str) -> str:
    """Run ``factstream ARGS``: it fails with one line, names the URL masked, and shows no piece of ``password``."""
    done = cli(*args, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode in (1, 2), said
    assert no_traceback(said), said
    leaked = [p for p in _pieces(password) if p in said]
    assert not leaked, f"{leaked} shown in: {said}"
    assert MASK in done.stderr and done.stderr.startswith(f"factstream {args[0]}"), said
    return done.stderr


@pytest.mark.parametrize("password", [LETTERS, HASHED, DIGITS])
def test_tail_db(password: str) -> None:
    """--db is checked before tail connects: 'bad host or port in postgresql://u:Qz7kq/Wv9xw?Jm4pj@...' was shown."""
    _fails_masked(password, "tail", "--db", f"postgresql://u:{password}@127.0.0.1:{free_port()}/x",
                  f"127.0.0.1:{free_port()}", "--connect-timeout", "2")


@pytest.mark.parametrize("password", [LETTERS, HASHED, DIGITS])
def test_positions_db(password: str) -> None:
    """DIGITS: libpq's 'missing key/value separator "=" in URI query parameter: "Jm4pj@127.0.0.1:..."' was shown."""
    _fails_masked(password, "positions", "--db", f"postgresql://u:{password}@127.0.0.1:{free_port()}/x",
                  "--db-timeout", "10")


@pytest.mark.parametrize("password", [LETTERS, HASHED, DIGITS])
def test_status_nats(password: str) -> None:
    """'bad NATS URL 'nats://u:Qz7kq/Wv9xw?Jm4pj@127.0.0.1:...': the port must be a number' was shown."""
    _fails_masked(password, "status", "--nats", f"nats://u:{password}@127.0.0.1:{free_port()}",
                  "--server-name", "hs1", "--connect-timeout", "2", "--interval", "0.2")


@pytest.mark.parametrize(
    ("command", "url"),
    [  # the shapes of the report: every piece has 2 characters, so the whole password is what is looked for
        ("tail", "redis://:s3/cr#et@127.0.0.1:{port}"),
        ("positions", "redis://:s3/cr#et@127.0.0.1:{port}"),
        ("tail", "nats://u:s3/cr?et@127.0.0.1:{port}"),
    ],
)
def test_the_reported_urls(command: str, url: str) -> None:
    option = "--redis" if url.startswith("redis") else "--nats"
    _fails_masked("s3/cr#et" if "#" in url else "s3/cr?et", command, option, url.format(port=free_port()),
                  "--server-name", "hs1", "--connect-timeout", "2")


@pytest.mark.parametrize("password", [HASHED, DIGITS])
def test_tail_redis(password: str) -> None:
    _fails_masked(password, "tail", "--redis", f"redis://:{password}@127.0.0.1:{free_port()}",
                  "--server-name", "hs1", "--connect-timeout", "2")


def test_synapse_check_db() -> None:
    _fails_masked(DIGITS, "synapse", "check", "--db", f"postgresql://u:{DIGITS}@127.0.0.1:{free_port()}/x",
                  "--db-timeout", "10")
