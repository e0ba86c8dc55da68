"""Passwords never reach output: every URL shape a user types, masked by redact_url / redact_text."""

from __future__ import annotations

import pytest

from conftest import require

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


# --- One reading of a URL's userinfo, for the masking and for the database layer --------------------------------
#
# redaction.py and store/database.py each read where a password is; a password one reading found and the other
# did not was printed. Each case below was shown before both used redaction.userinfo_ends / url_passwords.

#: Strings that are URLs (redact_url, shown_url), with a password libpq reads whole: a quote, a space or an angle
#: bracket before its '?' or '#'. (In free text those characters end a URL: redact_text cannot tell.)
URL_ONLY = [
    ("postgresql://u:it's?s3cret@h/db", f"postgresql://u:{MASK}@h/db"),  # was shown whole by redact_url
    ('postgresql://u:a"b#s3cret@h:5432,h2:5433/db', f"postgresql://u:{MASK}@h:5432,h2:5433/db"),
    ("postgresql://u:a<b?s3cret@[::1]:5432/db", f"postgresql://u:{MASK}@[::1]:5432/db"),
    ("postgresql://u:a b?s3cret@h/db", f"postgresql://u:{MASK}@h/db"),
]


@pytest.mark.parametrize(("given", "shown"), URL_ONLY)
def test_a_url_is_read_as_libpq_reads_it(given: str, shown: str) -> None:
    from factstream.store.database import shown_url

    assert redact_url(given) == shown
    assert shown_url(given) == shown
    assert redact_url(shown) == shown


@pytest.mark.parametrize(
    ("given", "shown"),
    [  # libpq reads a '#' in a query value as part of it; urlsplit ended the query there: password=***#s3cret
        ("postgresql://h/db?password=ab#s3cret", f"postgresql://h/db?password={MASK}"),
        ("redis://h:6379/0?password=ab#s3cret", f"redis://h:6379/0?password={MASK}"),
        ("postgresql://h/db?sslmode=require&sslpassword=ab#s3cret", f"postgresql://h/db?sslmode=require&sslpassword={MASK}"),
    ],
)
def test_a_query_password_is_masked_to_its_end(given: str, shown: str) -> None:
    assert redact_url(given) == shown
    assert SECRET not in redact_text(f"cannot connect to {given}: refused")


def _libpq_passwords(url: str) -> list[str]:
    conninfo = require(module="psycopg.conninfo", how="pip install 'psycopg[binary]' (make install)")
    try:
        parsed = conninfo.conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - libpq refuses the URL: it reads no password out of it
        return []
    return [v for k, v in parsed.items() if k in ("password", "sslpassword") and isinstance(v, str) and len(v) >= 3]


_ODD = ["?", "#", "%40", "'", '"', "<", ">", " ", ",", ":", "[", "]", "=", "?#", "'?", '"#', "<?", " ?", "?@/"]
_FORMS = [
    "postgresql://u:s3{}cret@h:5432/db",
    "postgres://u:s3{}cret@h1:5432,h2:5433/db?sslmode=require",
    "postgresql://u:s3{}cret@[::1]:5432/db?application_name=a@b",
    "postgresql://u@h/db?password=s3{}cret",
    "postgresql://u@h/db?sslmode=require&sslpassword=s3{}cret&application_name=x",
]


@pytest.mark.parametrize("url", [form.format(odd) for form in _FORMS for odd in _ODD])
def test_the_password_libpq_reads_is_the_one_masked(url: str) -> None:
    from factstream import redaction
    from factstream.store.database import _url_passwords, shown_url

    for password in _libpq_passwords(url):
        assert password not in redact_url(url)
        assert password not in shown_url(url)
        assert password in _url_passwords(url)
        assert password in redaction.url_passwords(url)  # the masking's own reading finds libpq's password


async def test_an_sslpassword_the_driver_quotes_back_is_masked() -> None:
    """libpq says 'invalid percent-encoded token: "Qx%zz9s3cret"'; the database layer scrubbed only password=.
    Refused before any connect now (a URL libpq cannot read: DatabaseURLError, exit 2 in the CLI)."""
    from factstream.store.database import DatabaseURLError, connect

    with pytest.raises(DatabaseURLError) as caught:
        await connect("postgresql://u@127.0.0.1:1/db?sslmode=require&sslpassword=Qx%zz9s3cret")
    assert 'invalid percent-encoded token: "***"' in str(caught.value)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("url", ["postgres:s3cret@127.0.0.1:5432/db", "u:s3cret@127.0.0.1:5432"])
def test_a_url_typed_without_its_scheme_is_refused_with_its_password_masked(url: str) -> None:
    """It was named as a file path, password and all: "'u:s3cret@...' is a file path ... write sqlite:///u:s3cret@..."."""
    from factstream.store.database import DatabaseURLError, check_url

    with pytest.raises(DatabaseURLError) as caught:
        check_url(url)
    assert SECRET not in str(caught.value) and f":{MASK}@127.0.0.1" in str(caught.value)
    assert "is not a database URL" in str(caught.value)


def test_an_at_in_the_query_does_not_hide_a_bad_port() -> None:
    """The host check read the hosts after the last '@' anywhere (here the query's), found no fault and let it pass."""
    from factstream.store.database import DatabaseURLError, check_url

    with pytest.raises(DatabaseURLError, match="must be a number 0-65535"):
        check_url("postgresql://u:s3cret@h:99999/db?application_name=a@b")
    with pytest.raises(DatabaseURLError, match="holds a character that ends it early: percent-encode"):
        check_url("postgresql://u:s3@cret@h:5432/db?application_name=a@b")
    assert check_url("postgresql://u:pa?s3cret@h:5432,h2:5433/db?application_name=a@b") == "postgres"


# --- A password holding '/' and then '?' or '#' --------------------------------------------------------------------
#
# A URL parser ends the authority at the '/' (host u, "port" pa): neither libpq's '@' nor the last one before the
# query is there, and redact_url, redact_text and url_passwords showed such a password whole. Each case below was.

#: (what a user gave, what may be shown, its passwords)
SLASH_THEN_QUERY = [
    ("postgresql://u:s3/cr?et@h:5432/db", f"postgresql://u:{MASK}@h:5432/db", ["s3/cr?et"]),
    ("redis://:s3/cr#et@127.0.0.1:6379/0", f"redis://:{MASK}@127.0.0.1:6379/0", ["s3/cr#et"]),
    ("nats://u:s3/cr?et@h:4222", f"nats://u:{MASK}@h:4222", ["s3/cr?et"]),
    ("postgresql://u:s3c/ret?x@h1:5432,h2:5433/db?sslmode=require",
     f"postgresql://u:{MASK}@h1:5432,h2:5433/db?sslmode=require", ["s3c/ret?x"]),
    ("postgresql://u:s3c/ret#x@[::1]:5432/db", f"postgresql://u:{MASK}@[::1]:5432/db", ["s3c/ret#x"]),
    ("rediss://s3c/ret?x@h:6380/0", f"rediss://{MASK}@h:6380/0", ["s3c/ret?x"]),  # a token
    ("nats://u:s3c/ret?x@h1:4222,nats://v:s3c/ret#y@h2:4222", f"nats://u:{MASK}@h1:4222,nats://v:{MASK}@h2:4222",
     ["s3c/ret?x", "s3c/ret#y"]),
    ("u:s3c/ret?x@127.0.0.1:4222", f"u:{MASK}@127.0.0.1:4222", ["s3c/ret?x"]),  # typed without a scheme
    # the query after the real host keeps its '@'
    ("postgresql://u:s3/cr?et@h:5432/db?application_name=a@b", f"postgresql://u:{MASK}@h:5432/db?application_name=a@b",
     ["s3/cr?et"]),
    ("redis://:s3/cr#et@127.0.0.1:6379/0?client_name=a@b", f"redis://:{MASK}@127.0.0.1:6379/0?client_name=a@b",
     ["s3/cr#et"]),
    # the password's first part is digits: a URL parser reads a real port (host u, port 48213), then a query
    # holding '@' in a bare word, not a key=value setting: libpq refuses that URL; it is read as a password
    ("postgresql://u:48213/Wv9xw?Jm4pj@127.0.0.1:5432/db", f"postgresql://u:{MASK}@127.0.0.1:5432/db",
     ["48213/Wv9xw?Jm4pj"]),
]


@pytest.mark.parametrize(("given", "shown", "passwords"), SLASH_THEN_QUERY)
def test_a_password_a_url_parser_cuts_is_masked_whole(given: str, shown: str, passwords: list[str]) -> None:
    from factstream.redaction import url_passwords

    assert redact_url(given) == shown
    for said in (f"cannot connect to {given}: refused", f"({given}).", repr(given)):
        assert redact_text(said) == said.replace(given, shown)
    for password in passwords:
        assert password in url_passwords(given)
    assert redact_url(shown) == shown and redact_text(shown) == shown


@pytest.mark.parametrize(
    "text",
    [  # an '@' in a query's setting after a real host, an email address after a URL: no password there
        "redis://h:6379/0?client_name=a@b",
        "postgresql://u@h/db?application_name=a@b#x",
        "redis://h:6379/0?client_name=a@b.org&x=1 failed",
        "cannot reach redis://h:6379/0 (mail ops@example.org)",
        "nats://h:4222,nats://h2:4222 is down: write to admin@example.org",
        "see http://h:8080/metrics?contact=ops@example.org.",
    ],
)
def test_an_at_that_ends_no_password_is_left_alone(text: str) -> None:
    from factstream.redaction import url_passwords

    assert redact_text(text) == text
    if " " not in text:
        assert redact_url(text) == text and url_passwords(text) == []


def test_the_masking_of_a_cut_password_leaves_the_rest_of_the_text() -> None:
    said = "cannot reach redis://:s3c/ret#x@127.0.0.1:6379/0 (mail ops@example.org), nor postgresql://u:pa@h/db"
    assert redact_text(said) == (
        f"cannot reach redis://:{MASK}@127.0.0.1:6379/0 (mail ops@example.org), nor postgresql://u:{MASK}@h/db"
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [  # what a URL parser's error quotes of a cut password: its "port", its "path", its "query"
        ("redis://:Qz7kq/Wv9xw#Jm4pj@127.0.0.1:1", "Port could not be cast to integer value as 'Qz7kq'"),
        ("redis://:48213/Wv9xw?Jm4pj@127.0.0.1:1", "the path names the database by number, not 'Wv9xw'"),
        ("postgresql://u:48213/Wv9xw?Jm4pj@h:1/x",
         'missing key/value separator "=" in URI query parameter: "Jm4pj@h:1/x"'),
        ("redis://:s3/cr#et@127.0.0.1:1", "Port could not be cast to integer value as 's3'"),  # 2 characters: quoted
    ],
)
def test_a_piece_of_a_cut_password_is_masked_in_a_message_about_its_url(url: str, message: str) -> None:
    from factstream.redaction import redact_about, url_passwords

    said = redact_about(message, url)
    assert MASK in said
    for piece in ("Qz7kq", "Wv9xw", "Jm4pj", "48213", "'s3'"):
        assert piece not in said
        if len(piece) >= 3 and piece in url:
            assert piece in url_passwords(url)  # what the database layer's scrub masks too


@pytest.mark.parametrize("password", ["Qz7kq/Wv9xw?Jm4pj", "Qz7kq/Wv9xw#Jm4pj"])
def test_the_database_layer_names_no_piece_of_a_cut_password(password: str) -> None:
    """check_url said "bad host or port in postgresql://u:Qz7kq/Wv9xw?Jm4pj@...: the port in 'u:Qz7kq' ..."."""
    from factstream.store.database import DatabaseURLError, check_url, shown_url

    url = f"postgresql://u:{password}@127.0.0.1:5432/db"
    assert shown_url(url) == f"postgresql://u:{MASK}@127.0.0.1:5432/db"
    with pytest.raises(DatabaseURLError) as caught:
        check_url(url)
    assert not any(piece in str(caught.value) for piece in ("Qz7kq", "Wv9xw", "Jm4pj")), str(caught.value)
    assert f"postgresql://u:{MASK}@127.0.0.1:5432/db" in str(caught.value)
