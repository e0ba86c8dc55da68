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

# scheme://user:password@host... anywhere in a text (the password is what sits
# between the first ':' after '//' and the last '@' of the authority).
_URL_SECRET = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(?P<secret>[^\s/@]*(?:@[^\s/@]*)*)(?P<at>@)")
# password=... in a libpq keyword/value string or a URL query string.
_KV_SECRET = re.compile(r"(?P<key>\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with any password (in the authority or the query) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
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
    text = _URL_SECRET.sub(lambda m: m.group("head") + MASK + m.group("at"), text)
    return _KV_SECRET.sub(lambda m: m.group("key") + MASK, text)
