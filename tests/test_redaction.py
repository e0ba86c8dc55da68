"""Passwords never reach output: every URL shape a user types, masked by redact_url / redact_text."""

from __future__ import annotations

import pytest

from factstream.redaction import MASK, redact_text, redact_url

SECRET = "s3cret"

#: (what a user gave, what may be shown)
URLS = [
    ("postgresql://postgres:s3cret@127.0.0.1:5432/db", f"postgresql://postgres:{MASK}@127.0.0.1:5432/db"),
    ("tls://u:s3cret@h:4222", f"tls://u:{MASK}@h:4222"),
    # a server list (NATS clusters): each server's password
    ("nats://u:s3cret@h1:4222,nats://v:s3cret@h2:4222", f"nats://u:{MASK}@h1:4222,nats://v:{MASK}@h2:4222"),
    # a userinfo without ':': a NATS token, or a Redis password that lost its colon (not a postgresql:// user)
    ("nats://s3cret@127.0.0.1:4222", f"nats://{MASK}@127.0.0.1:4222"),
    ("tls://s3cret@h:4222", f"tls://{MASK}@h:4222"),
    ("nats://s3cret@h1:4222,tls://s3cret@h2:4222", f"nats://{MASK}@h1:4222,tls://{MASK}@h2:4222"),
    ("redis://s3cret@127.0.0.1:6379/0", f"redis://{MASK}@127.0.0.1:6379/0"),
    ("rediss://s3cret@h:6380?ssl_cert_reqs=none", f"rediss://{MASK}@h:6380?ssl_cert_reqs=none"),
    # typed without a scheme
    ("u:s3cret@127.0.0.1:4222", f"u:{MASK}@127.0.0.1:4222"),
    (":s3cret@127.0.0.1:6379", f":{MASK}@127.0.0.1:6379"),
    ("postgres:s3cret@127.0.0.1:5432/db", f"postgres:{MASK}@127.0.0.1:5432/db"),
    # characters a URL parser ends the authority at, left unencoded in the password
    ("postgresql://postgres:s3/cret@127.0.0.1:1/x", f"postgresql://postgres:{MASK}@127.0.0.1:1/x"),
    ("redis://:s3/cret@127.0.0.1:bad", f"redis://:{MASK}@127.0.0.1:bad"),
    ("postgresql://u:s3@cret@h:5432/db", f"postgresql://u:{MASK}@h:5432/db"),
    ("postgresql://u:s3cret%40x@h/db?sslmode=require", f"postgresql://u:{MASK}@h/db?sslmode=require"),
    # query and libpq settings
    ("redis://127.0.0.1:6379/0?password=s3cret", f"redis://127.0.0.1:6379/0?password={MASK}"),
    ("unix:///tmp/r.sock?password=s3cret", f"unix:///tmp/r.sock?password={MASK}"),
    ("host=h password=s3cret dbname=x", f"host=h password={MASK} dbname=x"),
    # '?' and '#' in a password: libpq reads the userinfo to its first '@' (a URL parser stops at them)
    ("postgresql://u:pa?ss@127.0.0.1:5432/db", f"postgresql://u:{MASK}@127.0.0.1:5432/db"),
    ("postgresql://u:s3#cret@h/db?sslmode=require", f"postgresql://u:{MASK}@h/db?sslmode=require"),
    ("postgresql://u:a?b#c@h/db", f"postgresql://u:{MASK}@h/db"),
    # libpq's passphrase of the client key
    ("postgresql://u@h/db?sslmode=verify-full&sslpassword=s3cret", f"postgresql://u@h/db?sslmode=verify-full&sslpassword={MASK}"),
    ("host=h sslpassword=s3cret sslkey=/k", f"host=h sslpassword={MASK} sslkey=/k"),
]

#: URLs without a password come out as they went in.
PLAIN = ["sqlite:///x.db", "sqlite:////tmp/a@b.db", "postgresql://postgres@127.0.0.1/x", "postgresql:///db?host=/tmp",
         "postgres://postgres@h:5432/x,postgresql://u@h2/y",
         "nats://h1:4222,nats://h2:4222", "redis://127.0.0.1:6379", "w.db", "/tmp/a@b.db",
         "redis://h:6379/0?client_name=a@b", "postgresql://u@h/db?application_name=a@b#x"]


@pytest.mark.parametrize(("given", "shown"), URLS)
def test_url_passwords_are_masked(given: str, shown: str) -> None:
    assert redact_url(given) == shown
    said = redact_text(f"cannot connect to {given}: refused")
    assert SECRET not in said and MASK in said and said.startswith(f"cannot connect to {shown.split('=')[0]}")
    assert SECRET not in redact_text(repr(given))


@pytest.mark.parametrize("url", PLAIN)
def test_urls_without_a_password_are_unchanged(url: str) -> None:
    assert redact_url(url) == url
    assert redact_text(url) == url


@pytest.mark.parametrize(
    "text",
    [
        'bad line \'RDATA typing m 1 ["!r:hs",["@u0:hs"]]\'',  # rows hold Matrix ids: user:server
        "@alice:example.org invited @bob:hs",
        "at https://host:443/path ok",
        "mail a@b.org",
    ],
)
def test_text_without_a_password_is_unchanged(text: str) -> None:
    assert redact_text(text) == text


def test_masking_twice_changes_nothing_more() -> None:
    for given, shown in URLS:
        assert redact_url(shown) == shown
        assert redact_text(shown) == shown
