"""``synapse check``/``synapse watch`` refuse a --db URL whose user name or password is cut short in the words
every other command uses.

Before, ``synapse``'s own older check (``snapshot._unencoded``) ran first and
said "holds a character that a URL needs percent-encoded ('@' as %40, '/' as
%2F)" where ``positions`` (``store.database.check_url``) said "holds a
character that ends it early: percent-encode '/', '?' and '#' ..." or "holds an
'@': write it percent-encoded, %40 ...". It also caught a user name without a
password cut by an '@' (``postgresql://u@x@h/db@y``) that ``check_url`` let
through to a connect failing on host 'x@h'. Now one check, ``check_url``,
names all of them, for every command.
"""

from __future__ import annotations

import itertools
import subprocess

import pytest

from cli_run import cli, no_traceback
from factstream.store.database import DatabaseURLError, check_url
from factstream.synapse.snapshot import url_problem
from test_check_url_cut_password import HOSTS, TAILS, cut_urls, shown_pieces

#: (URL, its password or "" when it has none): cut short by an unencoded '/' or '@'.
BAD = [
    ("postgresql://postgres:Kq7/Wx4@127.0.0.1:1/synapse", "Kq7/Wx4"),         # synapse said "'/' as %2F"
    ("postgresql://postgres:Kq7@Wx4@127.0.0.1:1/synapse", "Kq7@Wx4"),         # synapse said "'@' as %40"
    ("postgresql://u:Kq7@Wx4/Zp9@127.0.0.1:1/db", "Kq7@Wx4/Zp9"),
    ("postgresql://:Kq7@Wx4#Zp9@127.0.0.1:1/db", "Kq7@Wx4#Zp9"),
    ("postgresql://postgres:Kq7/Wx4?Zp9@127.0.0.1:1/synapse", "Kq7/Wx4?Zp9"),
    ("postgresql://uKq7@Wx4@127.0.0.1:1/db@x", ""),                           # a user name alone, cut at its '@':
    ("postgresql://Kq7@Wx4#Zp9@127.0.0.1:1/db", ""),                          # refused by synapse only, before
    ("postgresql://uKq7@Wx4@Zp9/Mn2@127.0.0.1:1/db", ""),
]

COMMANDS = {
    "synapse check": ["synapse", "check", "--db"],
    "synapse watch": ["synapse", "watch", "--redis", "redis://127.0.0.1:1/0", "--server-name", "x.test",
                      "--duration", "1", "--db"],
    "positions": ["positions", "--db-timeout", "5", "--db"],
}


def reason(name: str, proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused --db gets, without ``factstream COMMAND: `` and ``--db: ``."""
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, (name, proc.returncode, said)
    assert no_traceback(said), said
    line = proc.stderr.rstrip("\n")
    prefix = f"factstream {name}: "
    assert line.startswith(prefix), line
    line = line[len(prefix):]
    return line[len("--db: "):] if line.startswith("--db: ") else line


def check_url_says(url: str) -> str:
    with pytest.raises(DatabaseURLError) as caught:
        check_url(url)
    return str(caught.value)


@pytest.mark.parametrize(("url", "secret"), BAD)
def test_every_command_gives_the_same_reason(url: str, secret: str) -> None:
    said = {name: reason(name, cli(*args, url)) for name, args in COMMANDS.items()}
    assert len(set(said.values())) == 1, said
    assert said["positions"] == check_url_says(url), said
    assert "percent-encode" in said["positions"] and "port in" not in said["positions"], said
    if secret:
        assert not any(shown_pieces(secret, s) for s in said.values()), said


def user_name_cut_urls() -> list[str]:
    """A user name without a password that an unencoded '@' cuts, libpq reading the rest of it as the host."""
    out = []
    for (a, b), host, tail in itertools.product([("@", "@"), ("@", "#"), ("?", "@"), ("#", "@")], HOSTS,
                                                (*TAILS, "/db@x")):
        out.append(f"postgresql://Kq7{a}Wx4{b}Zp9@{host}{tail}")
    return out


@pytest.mark.parametrize("url", [url for _, url in cut_urls()] + user_name_cut_urls())
def test_synapse_url_problem_is_check_urls_message(url: str) -> None:
    """One check: url_problem (synapse check/watch) says what check_url (every other command) says."""
    assert url_problem(url) == check_url_says(url)


@pytest.mark.parametrize("url", [
    "postgresql://u@h/db@x",                         # a database name holding '@'
    "postgresql://h/db@x",
    "postgresql://u@h:5432/db@x?sslmode=disable",
    "postgresql://u@h/db?application_name=a@b",      # an '@' in a setting of the query
    "postgresql://h/a@b",
    "postgresql://u%40x@h/db@y",                     # the user name's '@' percent-encoded
])
def test_a_user_name_libpq_reads_whole_still_passes(url: str) -> None:
    assert check_url(url) == "postgres"
    assert url_problem(url) is None
