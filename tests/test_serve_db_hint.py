"""``factstream serve --db postgresql://...``: a readable URL form in its hints, and no real password in its output.

Before: the hint "check that ... the URL (postgresql://user:password@host:port/db) is right" went
through the password masking like everything else and was shown as ``postgresql://user:***@host``
(the placeholder masked); so was the key=value hint. And a real password the masking did not
see whole was shown: one holding '?' or '#' (valid to libpq; ``serve`` refused it as "bad host or
port in postgresql://u:pa?ss@...", or printed it in its start-up line), one a driver quotes back
("invalid percent-encoded token: \\"pa%zz\\"", "unexpected spaces found in \\"pa ss\\""), and the part
after an unencoded '@' ("failed to resolve host 'ss@127.0.0.1'"). Run through the installed
``factstream`` executable, as a user would.
"""

from __future__ import annotations

import signal

import pytest

from cli_run import cli, free_port, start, stop
from conftest import PG_HOST, PG_PORT, PG_USER

#: The hint's form of a PostgreSQL URL, placeholders readable.
FORM = "postgresql://<user>:<password>@<host>:<port>/<dbname>"


def no_secret(secret: str, *outputs: str) -> None:
    for out in outputs:
        assert secret not in out, f"the password {secret!r} was shown: {out}"


@pytest.mark.parametrize("flags", [(), ("-vv",)])
def test_the_hint_of_a_failed_connect_shows_the_url_form_and_masks_the_real_password(flags: tuple[str, ...]) -> None:
    secret = "Hunter2secretPW"
    port = free_port()  # nothing listens there
    proc = cli("serve", *flags, "--db", f"postgresql://alice:{secret}@127.0.0.1:{port}/app", "--port", "0")
    assert proc.returncode == 1, proc
    assert f"the URL ({FORM}) is right" in proc.stderr, proc.stderr
    assert "user:***@host" not in proc.stderr, proc.stderr
    assert f"postgresql://alice:***@127.0.0.1:{port}/app" in proc.stderr, proc.stderr
    no_secret(secret, proc.stdout, proc.stderr)


def test_the_key_value_hint_shows_the_url_form_and_masks_the_real_password() -> None:
    secret = "Hunter2secretPW"
    proc = cli("serve", "--db", f"host=127.0.0.1 user=alice password={secret} dbname=app", "--port", "0")
    assert proc.returncode == 2, proc
    assert f"write it as a URL: {FORM}" in proc.stderr, proc.stderr
    assert "password=***" in proc.stderr, proc.stderr
    no_secret(secret, proc.stdout, proc.stderr)


@pytest.mark.parametrize(
    "password, shown_as",
    [
        ("Qx?9secretPW", None),  # valid to libpq: it was cut at '?', refused as a bad port, and shown
        ("Qx#9secretPW", None),
        ("Qx%zz9secretPW", '"***"'),  # quoted back by libpq: 'invalid percent-encoded token: "..."'
        ("Qx 9secretPW", '"***"'),  # 'unexpected spaces found in "..."'
    ],
    ids=["question-mark", "hash", "bad-percent", "space"],
)
@pytest.mark.parametrize("flags", [(), ("-vv",)])
def test_a_password_the_masking_did_not_see_whole_is_never_shown(
    password: str, shown_as: str | None, flags: tuple[str, ...]
) -> None:
    port = free_port()
    proc = cli("serve", *flags, "--db", f"postgresql://alice:{password}@127.0.0.1:{port}/app", "--port", "0")
    # '?' and '#': valid to libpq, a connect that fails (exit 1; was: exit 2, "bad host or port"); a bad '%' or a
    # space: libpq cannot read the URL, refused before anything connects (exit 2) in libpq's words
    assert proc.returncode == (1 if shown_as is None else 2), proc
    assert f"postgresql://alice:***@127.0.0.1:{port}/app" in proc.stderr, proc.stderr
    if shown_as is not None:
        assert shown_as in proc.stderr, proc.stderr
    for part in {password, password.replace("%zz", "").replace(" ", ""), "9secretPW"}:
        no_secret(part, proc.stdout, proc.stderr)


def test_a_password_with_an_unencoded_at_is_refused_saying_how_to_write_it() -> None:
    """libpq ends the password at the first '@': "failed to resolve host 'Rest9secret@127.0.0.1'" showed the rest."""
    port = free_port()
    proc = cli("serve", "--db", f"postgresql://alice:Qx@Rest9secret@127.0.0.1:{port}/app", "--port", "0")
    assert proc.returncode == 2, proc
    assert "holds a character that ends it early" in proc.stderr, proc.stderr
    assert "'@' as %40" in proc.stderr, proc.stderr
    assert f"postgresql://alice:***@127.0.0.1:{port}/app" in proc.stderr, proc.stderr
    no_secret("Rest9secret", proc.stdout, proc.stderr)


@pytest.mark.postgres
@pytest.mark.parametrize("password", ["Hunter2secretPW", "Qx?9secretPW", "Qx#9secretPW"])
def test_a_running_serve_never_shows_its_password(postgres_dsn: str, password: str) -> None:
    """The start-up line said 'db postgresql://postgres:Qx?9secretPW@...': the URL masking ended the
    authority at '?' or '#' and saw no password. (The test server trusts local connections: the
    password is sent, never checked.)"""
    database = postgres_dsn.rsplit("/", 1)[1]
    url = f"postgresql://{PG_USER}:{password}@{PG_HOST}:{PG_PORT}/{database}"
    proc = start("serve", "-v", "--db", url, "--port", "0")
    assert proc.stderr is not None
    banner = ""
    for _ in range(50):
        line = proc.stderr.readline()
        banner += line
        if not line or line.startswith("factstream serve:"):
            break
    out, err = stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, (banner, err)
    assert f"db postgresql://{PG_USER}:***@{PG_HOST}:{PG_PORT}/{database}" in banner, banner
    no_secret(password, banner, out, err)
    no_secret("9secretPW", banner, out, err)
