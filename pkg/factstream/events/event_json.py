"""Reading the fields the store needs out of received event JSON, and pruning.

The raw bytes are kept as received (signatures cover them); this module only
parses a copy to fill the query columns, and builds the pruned form returned
for redacted events (Matrix redaction algorithm, room versions 1-10 key sets).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import FactstreamError

__all__ = ["EventFields", "InvalidEvent", "event_bytes", "parse_event", "prune_event_json"]


class InvalidEvent(FactstreamError, ValueError):
    """Event JSON the store cannot index; the message names the missing or bad field."""


@dataclass(frozen=True, slots=True)
class EventFields:
    """The parsed columns of one event."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    sender: str
    depth: int
    prev_events: tuple[str, ...]
    membership: str | None
    redacts: str | None
    relates_to: str | None
    history_visibility: Any

    @property
    def is_state(self) -> bool:
        return self.state_key is not None

    @property
    def state_key_pair(self) -> tuple[str, str]:
        assert self.state_key is not None
        return (self.type, self.state_key)


#: What no indexed column may hold: NUL (PostgreSQL's TEXT refuses it, SQLite took it, so the engines
#: disagreed) and lone UTF-16 surrogates from a ``\ud800`` escape (no UTF-8 form: the driver raised).
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_MAX_DEPTH = (1 << 63) - 1


def _text(value: str, what: str, *, empty: bool = True) -> str:
    """``value`` if it can go in a TEXT column of both engines; InvalidEvent naming ``what`` otherwise."""
    bad = _BAD_TEXT.search(value)
    if bad is not None:
        kind = "a NUL character" if bad.group() == "\x00" else "a lone surrogate (not valid UTF-8)"
        raise InvalidEvent(f"{what} holds {kind}: {value!r:.200}")
    if not empty and not value:
        raise InvalidEvent(f"{what} must not be empty")
    return value


def _str(obj: dict[str, Any], key: str, where: str = "event", *, empty: bool = True) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidEvent(f"{where} field {key!r} must be a string, got {value!r}")
    return _text(value, f"{where} field {key!r}", empty=empty)


def _opt(value: str | None, what: str) -> str | None:
    return None if value is None else _text(value, what)


def _prev_ids(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidEvent(f"prev_events must be a list, got {raw!r}")
    out = []
    for item in raw:
        # Room v1/v2 use [event_id, hashes] pairs, later versions bare ids.
        if isinstance(item, list) and item and isinstance(item[0], str):
            out.append(_text(item[0], "prev_events entry"))
        elif isinstance(item, str):
            out.append(_text(item, "prev_events entry"))
        else:
            raise InvalidEvent(f"prev_events entry must be an event id, got {item!r}")
    return tuple(out)


def event_bytes(raw: object) -> bytes:
    """The bytes to store for ``raw``: bytes as given, a str as its UTF-8 text.

    A str stored as-is became a TEXT value in SQLite's BLOB column, which every
    read of the room then failed on.
    """
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, (bytearray, memoryview)):
        return bytes(raw)
    if isinstance(raw, str):
        try:
            return raw.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidEvent(f"event JSON text holds a lone surrogate (not valid UTF-8): {err}") from None
    raise InvalidEvent(f"an event is its JSON as bytes (or str), got {type(raw).__name__} {raw!r:.80}")


def parse_event(raw: bytes | str, event_id: str | None = None) -> EventFields:
    """Index fields of ``raw`` event JSON (UTF-8, as Matrix requires); ``event_id`` for formats without the key."""
    data = event_bytes(raw)
    try:
        # Strictly UTF-8: json.loads(bytes) would also take UTF-16/32, which no reader of the stored bytes expects.
        ev = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise InvalidEvent(f"event JSON is not UTF-8: {err}") from None
    except ValueError as err:
        raise InvalidEvent(f"event is not valid JSON: {err}") from None
    except RecursionError:
        raise InvalidEvent("event JSON nests too deeply to parse") from None
    if not isinstance(ev, dict):
        raise InvalidEvent("event JSON must be an object")
    if event_id is not None:
        if not isinstance(event_id, str):
            raise InvalidEvent(f"event_id must be a string, got {event_id!r}")
        eid = _text(event_id, "event_id", empty=False)
    else:
        eid = _str(ev, "event_id", empty=False)
    content = ev.get("content")
    if not isinstance(content, dict):
        content = {}
    etype = _str(ev, "type")
    state_key = ev.get("state_key")
    if state_key is not None and not isinstance(state_key, str):
        raise InvalidEvent(f"state_key must be a string, got {state_key!r}")
    state_key = _opt(state_key, "state_key")
    depth = ev.get("depth", 0)
    if not isinstance(depth, int) or isinstance(depth, bool):
        raise InvalidEvent(f"depth must be an integer, got {depth!r}")
    if not -_MAX_DEPTH - 1 <= depth <= _MAX_DEPTH:
        raise InvalidEvent(f"depth must fit a signed 64-bit integer, got {depth}")
    membership = None
    if etype == "m.room.member" and state_key is not None:
        m = content.get("membership")
        membership = m if isinstance(m, str) else None
    redacts = None
    if etype == "m.room.redaction":
        r = ev.get("redacts", content.get("redacts"))
        redacts = r if isinstance(r, str) else None
    relates_to = None
    rel = content.get("m.relates_to")
    if isinstance(rel, dict) and isinstance(rel.get("event_id"), str):
        relates_to = rel["event_id"]
    hist = content.get("history_visibility") if etype == "m.room.history_visibility" else None
    return EventFields(
        event_id=eid,
        room_id=_str(ev, "room_id", empty=False),
        type=etype,
        state_key=state_key,
        sender=_str(ev, "sender"),
        depth=depth,
        prev_events=_prev_ids(ev.get("prev_events")),
        membership=_opt(membership, "content field 'membership'"),
        redacts=_opt(redacts, "field 'redacts'"),
        relates_to=_opt(relates_to, "content field 'm.relates_to' event_id"),
        history_visibility=hist,
    )


_KEEP_TOP = (
    "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
    "depth", "prev_events", "prev_state", "auth_events", "origin", "origin_server_ts", "membership",
)
_KEEP_CONTENT: dict[str, Sequence[str]] = {
    "m.room.member": ("membership",),
    "m.room.create": ("creator",),
    "m.room.join_rules": ("join_rule",),
    "m.room.power_levels": (
        "ban", "events", "events_default", "kick", "redact", "state_default", "users", "users_default",
    ),
    "m.room.aliases": ("aliases",),
    "m.room.history_visibility": ("history_visibility",),
}


def prune_event_json(raw: bytes | str) -> bytes:
    """The redacted form of an event: only the keys the redaction algorithm keeps.

    Key order of what remains is preserved; the output is compact JSON (the
    pruned event is no longer the signed bytes, exactly as in Matrix).
    """
    ev = json.loads(raw)
    pruned = {k: v for k, v in ev.items() if k in _KEEP_TOP}
    content = ev.get("content") if isinstance(ev.get("content"), dict) else {}
    keep = _KEEP_CONTENT.get(ev.get("type", ""), ())
    pruned["content"] = {k: v for k, v in content.items() if k in keep}
    return json.dumps(pruned, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
