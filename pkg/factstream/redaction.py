"""One place that keeps secrets out of output.

Every URL that can reach a log line, an error message, ``--status`` or
``--json`` output goes through :func:`redact_url`; free text that may embed a
URL or a libpq ``password=`` setting (a driver's error message, say) goes
through :func:`redact_text`. Where a URL's userinfo and password are is read
once, here (:func:`userinfo_ends`, :func:`url_passwords`): a second reading
elsewhere could find a password this one does not, and print it.

A password is read three ways, and masked whole under each: to libpq's '@'
(the first, unless a '/' comes before it), to the last '@' before the
query, and, for one holding '/' and then '?' or '#' (``u:pa/ss?wd@h``, where
a URL parser ends the host at the '/' and takes ``pa`` for a port), to the
'@' in the query that a host follows. A message may quote such a piece alone
(``port 'pa'``): :func:`url_passwords` lists the pieces too, for
:func:`redact_about`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

__all__ = ["redact_url", "redact_text", "redact_about", "redact_settings", "split_userinfo", "url_passwords",
           "userinfo_ends", "MASK"]

#: What a password is replaced with.
MASK = "***"

# Where a URL starts in a text: scheme://
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# The next server of a comma-separated list (nats://a:pw@h1,nats://b:pw@h2): where one URL of a string ends.
_NEXT_URL = re.compile(r",(?=[A-Za-z][A-Za-z0-9+.\-]*://)")
# Where a URL's query (or fragment) starts, read from libpq's end of the userinfo.
_QUERY = re.compile(r"[?#]")
# Where a URL embedded in a text ends: also white space, a quote or an angle bracket.
_TEXT_URL_END = re.compile(r"[\s\"'<>]|,(?=[A-Za-z][A-Za-z0-9+.\-]*://)")
# user:password@host without a scheme (a URL typed without one), as its own word. The host must look like
# one (a name, an IPv4 or a bracketed IPv6 address, an optional port, then the end of the word or a path),
# so that text such as a Matrix id or a JSON row is left alone.
_BARE_SECRET = re.compile(
    r"(?<![\w/:@.%\-])(?P<head>[A-Za-z0-9._~%+\-]*:)(?!//)(?P<secret>[^\s@'\"]+?)(?P<at>@)"
    r"(?=(?:[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(?::\d+)?(?:[/\s'\",;:)?]|$))"
)
# Schemes whose userinfo without ':' is a secret too: NATS token auth (nats://TOKEN@host), and for Redis a
# password that lost its colon (redis://PASSWORD@host; a bare user name is rare there). In postgresql://user@
# it is a user name, shown as it is.
_TOKEN_SCHEMES = frozenset({"nats", "tls", "ws", "wss", "redis", "rediss"})
# One host of a URL's authority: a name, an IPv4 or a bracketed IPv6 address.
_HOST = r"(?:[A-Za-z0-9._~%\-]+|\[[0-9A-Fa-f:.]+\])"
# A host and its optional port where a URL's authority ends (at a '/', '?', '#' or the end): what follows the '@'
# that ends a userinfo.
_HOST_PORT = re.compile(rf"{_HOST}(?::\d*)?(?=[/?#]|$)")
# The same for the '@' in a query that ends a password (u:pa/ss?wd@h): libpq's host list (h1:5432,h2:5433) too,
# or none at all, a Unix socket (u:pa#ss/wd@/db: the whole password was shown), and in free text trailing
# punctuation ("...@h:4222: refused").
_HOSTS_AFTER_AT = re.compile(rf"(?:{_HOST}(?::\d*)?(?:,{_HOST}(?::\d*)?)*)?(?=[/?#]|$)")
_HOSTS_AFTER_AT_IN_TEXT = re.compile(rf"{_HOST}(?::\d*)?(?:,{_HOST}(?::\d*)?)*(?=[/?#]|[.,:;!)\]]*$)")
# What a URL parser may take for a URL's hosts and be right: none (a Unix socket) or host[:port] items (a ':'
# with no port after it is a password's colon: u:/pa?ss@h).
_PARSED_HOSTS = re.compile(rf"{_HOST}?(?::\d+)?(?:,{_HOST}?(?::\d+)?)*")
# A key=value setting of a query (client_name=a@b): a key of name characters.
_SETTING = re.compile(r"[A-Za-z0-9_.%+\-]+=")
# Where a URL parser ends the authority.
_AUTHORITY_END = re.compile(r"[/?#]")
# What a URL parser cuts a password into (its port, a path, a query): each piece may be quoted alone.
_PIECES = re.compile(r"[/?#@:]")
# password=... (and libpq's sslpassword=, the client key's passphrase) in a libpq keyword/value string or a URL
# query string. A value runs to white space or '&': libpq reads a '#' in it as part of it.
_KV_SECRET = re.compile(r"(?P<key>\b(?:ssl)?password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)


def userinfo_ends(run: str) -> tuple[int, int, int]:
    """Where the userinfo of a URL may end in ``run`` (what follows ``scheme://``): (first, last, query).

    ``first`` is libpq's '@': the first one, unless a '/' comes before it.
    libpq takes the password up to there whatever it holds ('?', '#', ':',
    a quote, a space), so it is masked whole, not cut where a URL parser
    would end the authority. ``last`` is the last '@' before ``query``
    (where the query or fragment starts, ``len(run)`` if none): a password
    holding an unencoded '@' (libpq refuses it) or '/' (a URL parser's
    reading). An '@' in the query (``application_name=a@b``) is no
    password's. -1: no such '@'.
    """
    first = -1
    for i, ch in enumerate(run):
        if ch in "@/":
            first = i if ch == "@" else -1
            break
    found = _QUERY.search(run, max(first, 0))
    query = found.start() if found else len(run)
    return first, run.rfind("@", 0, query), query


def _late_password_at(run: str, after: int, in_text: bool = False) -> int:
    """The '@' past ``after`` ending a password a URL parser cuts at its '/' then '?' or '#' (-1: none).

    ``run`` follows ``scheme://``; ``after`` is the later '@' of
    :func:`userinfo_ends`. The '@' is in the query or fragment, a host list and
    the authority's end follow it. One inside a ``key=value`` setting
    (``client_name=a@b``) ends a password only if no other '@' does and
    what a parser takes for the host (``u:pa`` of ``u:pa/ss?wd@h``) is none.
    So after a real host (``h:6379/0?client_name=a@b``) only an '@' in a bare
    word counts: ``u:1234/5?6@h`` (host u, port 1234?) is masked whole,
    ``http://h:80/x?me@mail.org`` is too (they cannot be told apart).
    """
    hosts = _HOSTS_AFTER_AT_IN_TEXT if in_text else _HOSTS_AFTER_AT
    ats = []
    at = run.find("@", after + 1)
    while at >= 0:
        if hosts.match(run, at + 1):
            ats.append(at)
        at = run.find("@", at + 1)
    bare = [at for at in ats if not _SETTING.match(run, max(run.rfind(c, 0, at) for c in "?#&") + 1, at)]
    if bare:
        return bare[-1]
    netloc = _AUTHORITY_END.split(run, maxsplit=1)[0]
    if ats and not _PARSED_HOSTS.fullmatch(netloc.rpartition("@")[2]):
        return ats[-1]
    return -1


def _password_spans(run: str, scheme: str, in_text: bool = False) -> tuple[list[tuple[int, int]], int]:
    """Where a password may be in ``run`` (a URL after its ``scheme://``), one span per reading; where its query starts.

    The password runs from the first ':' to the '@' of each reading: those
    of :func:`userinfo_ends` (libpq's and the last before the query) and
    :func:`_late_password_at`'s, after whose hosts the query then starts.
    For a scheme of :data:`_TOKEN_SCHEMES`, a userinfo without ':' (a token)
    is a secret whole.
    """
    first, last, query = userinfo_ends(run)
    late = _late_password_at(run, max(first, last), in_text)
    if late >= 0:
        found = _QUERY.search(run, late + 1)
        query = found.start() if found else len(run)
    spans = []
    for at in dict.fromkeys((first, last, late)):
        colon = run.find(":", 0, at) if at >= 0 else -1
        if colon >= 0:
            spans.append((colon + 1, at))
        elif at > 0 and scheme.lower() in _TOKEN_SCHEMES:
            spans.append((0, at))
    return spans, query


def _mask_authority(run: str, scheme: str = "", in_text: bool = False) -> tuple[str, int]:
    """``run`` (a URL after its ``scheme://``) up to its query, every password reading masked; where the query starts."""
    spans, query = _password_spans(run, scheme, in_text)
    if not spans:
        return run[:query], query
    return run[: min(s for s, _ in spans)] + MASK + run[max(e for _, e in spans) : query], query


def _mask_urls(text: str, in_text: bool) -> str:
    """Every ``scheme://user:password@`` in ``text`` masked (each server of a comma-separated list).

    A URL ends in a text (``in_text``) at white space or a quote too, in a
    string that is a URL (where libpq reads a space or a quote as part of a
    password) only at the next server of a list.
    """
    url_end = _TEXT_URL_END if in_text else _NEXT_URL
    out: list[str] = []
    pos = 0
    for m in _SCHEME.finditer(text):
        if m.start() < pos:
            continue  # inside an authority already masked
        end = url_end.search(text, m.end())
        word = text[m.end() : end.start() if end else len(text)]
        masked, query = _mask_authority(word, m.group()[:-3], in_text)
        out.append(text[pos : m.end()])
        out.append(masked)
        pos = m.end() + query  # the query is left to _KV_SECRET, and may hold a URL of its own
    out.append(text[pos:])
    return "".join(out)


def _mask_settings(text: str) -> str:
    """``text`` with every bare ``user:password@host`` and ``password=`` setting masked."""
    text = _BARE_SECRET.sub(lambda m: m.group("head") + MASK + m.group("at"), text)
    return _KV_SECRET.sub(lambda m: m.group("key") + MASK, text)


def _schemeless(url: str) -> bool:
    """Whether ``url`` is ``user:password@host...`` typed without its scheme (not libpq's key=value form)."""
    head = url.partition("?")[0]
    return "://" not in url and "@" in url and "=" not in head


def _pieces(password: str, shortest: int = 3) -> set[str]:
    """``password`` as written and decoded, and each piece (of ``shortest`` characters or more) a URL parser may
    cut it into: a port, a path, a query."""
    found = {password, unquote(password)}
    for piece in _PIECES.split(password):
        found.update(p for p in (piece, unquote(piece)) if len(p) >= shortest)
    return found


def _url_runs(url: str) -> list[tuple[str, str]]:
    """(scheme, what follows its ``://``) for each server URL in ``url`` (a comma-separated list too)."""
    runs = []
    for m in _SCHEME.finditer(url):
        end = _NEXT_URL.search(url, m.end())
        runs.append((m.group()[:-3], url[m.end() : end.start() if end else len(url)]))
    return runs


def url_passwords(url: str) -> list[str]:
    """Every string ``url`` may hold as a password (longest first), as written and decoded: what masking hides.

    Each reading of the userinfo (:func:`_password_spans`; also of a URL
    typed without its scheme), a token of :data:`_TOKEN_SCHEMES`, and every
    ``password=`` or ``sslpassword=`` setting (a URL's query or libpq's
    keyword/value form), percent-decoded and unquoted as libpq would; and
    the pieces of 3 characters or more a URL parser cuts each into at '/',
    '?', '#', '@' and ':' (``pass`` of ``u:pass/wd?x@h``, its "port"),
    which a message may quote.
    """
    runs = _url_runs(url)
    if _schemeless(url):
        runs.append(("", url))
    found: set[str] = set()
    for scheme, run in runs:
        for s, e in _password_spans(run, scheme)[0]:
            found.update(_pieces(run[s:e]))
    for m in _KV_SECRET.finditer(url):
        value = m.group("secret")
        found.update(_pieces(value))
        if len(value) > 1 and value[0] == value[-1] == "'":
            found.update((value[1:-1], re.sub(r"\\(.)", r"\1", value[1:-1])))
    return sorted((p for p in found if p and p != MASK), key=len, reverse=True)


def redact_url(url: str) -> str:
    """``url`` with any password (in the authority or the query) replaced by ``***``.

    Also a comma-separated list of server URLs (each masked), and a URL given
    without its scheme (``user:password@host:port``).
    """
    if "://" not in url:  # user:password@host typed without a scheme, or libpq's key=value form
        if _schemeless(url):
            masked, query = _mask_authority(url)
            url = masked + url[query:]
        return redact_text(url)
    return _mask_settings(_mask_urls(url, in_text=False))


def redact_settings(text: str) -> str:
    """``text`` (a URL's host, path and query, say) with every ``password=`` / ``sslpassword=`` setting and the
    password of every embedded ``scheme://`` URL masked; a bare ``user:password@host`` is not looked for (in a URL's
    ``h:5432/db?application_name=a@b`` it would take ``5432/db?application_name=a`` for one)."""
    return _KV_SECRET.sub(lambda m: m.group("key") + MASK, _mask_urls(text, in_text=True))


def redact_text(text: str) -> str:
    """``text`` with the password of every embedded URL or ``password=`` setting masked."""
    return _mask_settings(_mask_urls(text, in_text=True))


# --- A message about one URL --------------------------------------------------------------------------------
#
# What a URL parser (urllib's, an HTTP client's) makes of a password holding '/' before a '?' or '#': the
# authority ends at the '/', and the password's first part is a "nonnumeric port"; neither libpq's '@' nor the
# last one before the query is there. The masking reads such a password to the '@' of _late_password_at; a
# message about one URL (status) also masks it to the last '@' a host follows, even after a key=value setting:
# that URL is refused as readable two ways (split_userinfo), and its message must not show either reading.


def _late_at(run: str) -> int:
    """The last '@' in ``run`` (what follows ``scheme://``) that a host[:port] and the authority's end follow (-1)."""
    at = run.rfind("@")
    while at >= 0 and not _HOST_PORT.match(run, at + 1):
        at = run.rfind("@", 0, at)
    return at


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its ``user:password@`` and that userinfo as written (None: it has none), to send it apart.

    The userinfo ends at the last '@' before the query (:func:`userinfo_ends`)
    when a host follows it; else (``http://u:p/x?y@h``: a password holding '/'
    and then '?' or '#', where a URL parser ends the host) at the last '@' a
    host follows. When both leave a host, ``url`` means two things
    (``http://u:p@h/x?y@h2``, or a query holding '@'): ValueError, saying
    what to percent-encode, ``url`` masked.
    """
    scheme, sep, run = url.partition("://")
    if not sep:
        return url, None
    ends = {userinfo_ends(run)[1], _late_at(run)}
    readable = [at for at in sorted(ends) if _HOST_PORT.match(run, at + 1)]
    if len(readable) > 1:
        raise ValueError(
            f"{redact_about(url, url)} can be read two ways (two '@'s could each end a password): "
            "percent-encode '@', '/', '?' and '#' in a user name, password or query (%40, %2F, %3F, %23)"
        )
    at = readable[0] if readable else max(ends)
    if at < 0:
        return url, None
    return f"{scheme}://{run[at + 1:]}", run[:at]


def redact_about(text: str, url: str, also: Iterable[str] = ()) -> str:
    """``text``, a message about ``url`` (or ``url`` itself), with every password ``url`` may hold masked in it.

    :func:`redact_text` finds a password only where it stands in a URL or a
    setting; a message may also quote one bare, or show ``url`` read the way
    a URL parser reads it (:func:`split_userinfo`). Every reading of
    :func:`url_passwords`, and the last '@' a host follows, is masked wherever
    it appears, before the URLs are (which would cut a longer reading in two).
    A password of one or two characters, or such a piece of one (``'pa'``,
    the "port" of ``u:pa/ss?wd@h``), is masked only where it stands quoted,
    so that every such letter of the text is not. ``also``: the passwords a
    driver reads in ``url`` (libpq's), masked the same way.
    """
    found = set(url_passwords(url))
    found.update(also)
    found.update(piece for password in list(found) for piece in _pieces(password, shortest=1) if len(piece) < 3)
    for scheme, run in _url_runs(url):
        at = _late_at(run)
        colon = run.find(":", 0, at) if at >= 0 else -1
        start = colon + 1 if colon >= 0 else 0 if at > 0 and scheme.lower() in _TOKEN_SCHEMES else -1
        if start >= 0:
            found.update((run[start:at], unquote(run[start:at])))
    for password in sorted((p for p in found if p and p != MASK), key=len, reverse=True):
        for quoted in (f'"{password}"', f"'{password}'"):
            text = text.replace(quoted, quoted[0] + MASK + quoted[0])
        if len(password) >= 3:
            text = text.replace(password, MASK)
    return redact_text(text)
