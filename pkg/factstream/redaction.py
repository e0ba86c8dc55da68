"""One place that keeps secrets out of output.

Every URL that can reach a log line, an error message, ``--status`` or
``--json`` output goes through :func:`redact_url`; free text that may embed a
URL or a libpq ``password=`` setting (a driver's error message, say) goes
through :func:`redact_text`.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_url", "redact_text", "MASK"]

#: What a password is replaced with.
MASK = "***"

# Where a URL starts in a text: scheme://
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# What ends a URL's authority-and-path run in a text: white space, a query or fragment, a quote, or the
# next server of a comma-separated list (nats://a:pw@h1,nats://b:pw@h2).
_RUN_END = re.compile(r"[\s?#\"'<>]|,(?=[A-Za-z][A-Za-z0-9+.\-]*://)")
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
# What ends a URL's userinfo as libpq reads it: its first '@', unless a '/' (the path) or the end of the word
# comes first. A password holding '?' or '#' is valid to libpq, where a URL parser ends the authority.
_USERINFO_END = re.compile(r"[@/\s\"'<>]")
# password=... (and libpq's sslpassword=, the client key's passphrase) in a libpq keyword/value string or a URL
# query string.
_KV_SECRET = re.compile(r"(?P<key>\b(?:ssl)?password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)


def _mask_authority(run: str, scheme: str = "") -> str:
    """``user:password@host/...`` (a URL after its ``scheme://``) with the password masked.

    The password runs from the first ':' to the last '@' of the run, so one
    holding '@' or an unencoded '/' is masked whole, not cut where a URL
    parser would end the authority. For a scheme of :data:`_TOKEN_SCHEMES`,
    a userinfo without ':' (a token) is masked whole.
    """
    at = run.rfind("@")
    if at < 0:
        return run
    colon = run.find(":", 0, at)
    if colon < 0:
        return MASK + run[at:] if scheme.lower() in _TOKEN_SCHEMES and at > 0 else run
    return run[: colon + 1] + MASK + run[at:]


def _mask_urls(text: str) -> str:
    """Every ``scheme://user:password@`` in ``text`` masked (each server of a comma-separated list)."""
    out: list[str] = []
    pos = 0
    for m in _SCHEME.finditer(text):
        if m.start() < pos:
            continue  # inside a run already masked
        end = _RUN_END.search(text, m.end())
        stop = end.start() if end else len(text)
        if stop < len(text) and text[stop] in "?#":  # the query, or a password holding '?'/'#' (libpq's reading)
            at = _USERINFO_END.search(text, m.end())
            if at is not None and text[at.start()] == "@" and at.start() > stop:
                end = _RUN_END.search(text, at.start())
                stop = end.start() if end else len(text)
        out.append(text[pos : m.end()])
        out.append(_mask_authority(text[m.end() : stop], m.group()[:-3]))
        pos = stop
    out.append(text[pos:])
    return "".join(out)


def redact_url(url: str) -> str:
    """``url`` with any password (in the authority or the query) replaced by ``***``.

    Also a comma-separated list of server URLs (each masked), and a URL given
    without its scheme (``user:password@host:port``).
    """
    if "://" not in url:  # user:password@host typed without a scheme, or libpq's key=value form
        head, sep, rest = url.partition("?")
        if "@" in head and "=" not in head:
            head = _mask_authority(head)
        return redact_text(head + sep + rest)
    run = url.split("://", 1)[1]
    at = _USERINFO_END.search(run)
    if at is not None and run[at.start()] == "@" and ("?" in run[: at.start()] or "#" in run[: at.start()]):
        return redact_text(url)  # a password holding '?' or '#': urlsplit would end the authority inside it
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if "," in parts.netloc or "@" in parts.path or parts.password is None and "@" in parts.netloc:
        return redact_text(url)  # a server list, a token, or a password urlsplit cut short: masked as text
    changed = parts
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        user = parts.username or ""
        changed = changed._replace(netloc=f"{user}:{MASK}@{host}")
    if parts.query:
        changed = changed._replace(query=_KV_SECRET.sub(lambda m: m.group("key") + MASK, parts.query))
    if changed == parts:
        return url  # urlunsplit would drop the '//' of 'sqlite:///x' and 'unix:///x'
    if not changed.netloc:
        return url.split("?", 1)[0] + "?" + changed.query
    return urlunsplit(changed)


def redact_text(text: str) -> str:
    """``text`` with the password of every embedded URL or ``password=`` setting masked."""
    text = _mask_urls(text)
    text = _BARE_SECRET.sub(lambda m: m.group("head") + MASK + m.group("at"), text)
    return _KV_SECRET.sub(lambda m: m.group("key") + MASK, text)
