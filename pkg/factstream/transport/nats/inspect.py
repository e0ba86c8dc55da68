"""What ``factstream status --nats`` shows: where each (stream, writer) stands in the log, and each reader.

Read from JetStream itself, so it needs none of the deployment's processes:
per log subject the last message (its sequence, time and the token it reaches)
and per reader the consumer JetStream keeps for it (the sequence delivered,
the messages still pending, and how long the oldest of them has waited), in
all and per (stream, writer).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from collections.abc import Mapping
from typing import Any

from ...redaction import redact_url
from .client import _Api, _ApiError, _prev_of, connect_nats
from .layout import JetStreamLayout
from .pages import page_end

#: Consumers describe themselves as "factstream <role> <instance name>" (see _LogConsumer).
CONSUMER_PREFIX = "factstream "
#: The throw-away consumers that count a subject's pending messages (not readers: no CONSUMER_PREFIX).
PROBE_DESCRIPTION = "pending count (factstream status)"


async def pending_after(api: _Api, subject: str, seq: int) -> int:
    """How many messages on ``subject`` JetStream holds after stream sequence ``seq``.

    JetStream counts them for a throw-away consumer starting at ``seq + 1``
    (its ``num_pending``); the consumer is deleted at once and expires by
    itself if that fails.
    """
    config = {
        "description": PROBE_DESCRIPTION,
        "deliver_policy": "by_start_sequence",
        "opt_start_seq": seq + 1,
        "filter_subject": subject,
        "ack_policy": "none",
        "mem_storage": True,
        "inactive_threshold": 10 * 1_000_000_000,
    }
    resp = await api.request(f"CONSUMER.CREATE.{api.layout.stream}",
                             {"stream_name": api.layout.stream, "config": config})
    await api.delete_consumer(str(resp["name"]))
    return int(resp.get("num_pending", 0) or 0)


async def behind_by_subject(api: _Api, delivered: int, subjects: Mapping[str, tuple[str | None, str | None]],
                            total_pending: int, now: float | None = None) -> list[dict[str, Any]]:
    """Per (stream, writer) subject: messages after sequence ``delivered`` and the age of the oldest of them.

    ``subjects`` maps each log subject to its (stream, writer). A reader's
    consumer delivers in stream order, so everything up to ``delivered`` has
    reached it on every subject. With nothing pending in all (``total_pending``
    0) no request is made.
    """
    now = time.time() if now is None else now
    out: list[dict[str, Any]] = []
    for subject, (stream, writer) in sorted(subjects.items()):
        pending = 0
        lag: float | None = 0.0
        if total_pending:
            oldest = await api.get(seq=delivered + 1, next_by_subject=subject)
            if oldest is not None:
                pending = await pending_after(api, subject, delivered)
                stored = parse_time(oldest.time)
                lag = round(max(0.0, now - stored), 3) if stored is not None else None
        out.append({"stream": stream, "writer": writer, "subject": subject, "pending": pending, "lag_seconds": lag})
    return out


def parse_time(text: str) -> float | None:
    """Seconds since the epoch of a JetStream RFC 3339 time (nanoseconds cut to microseconds)."""
    if not text:
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    try:
        when = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
    digits = "".join(c for c in frac if c.isdigit())[:9]
    return when + (int(digits) / 10 ** len(digits) if digits else 0.0)


async def inspect_deployment(url: str, server_name: str, *, stream: str | None = None,
                             timeout: float = 5.0) -> dict[str, Any]:
    """Writers (per subject) and readers (per consumer) of deployment ``server_name``'s log.

    Raises LookupError when the deployment has no JetStream stream at ``url``.
    """
    layout = JetStreamLayout.for_server(server_name, stream=stream)
    nc = await connect_nats(url, name="factstream-status", timeout=timeout, allow_reconnect=False,
                            max_reconnect_attempts=1)
    try:
        api = _Api(nc, layout, timeout)
        try:
            info = await api.request(f"STREAM.INFO.{layout.stream}")
        except _ApiError as err:
            if err.code != 404:
                raise
            raise LookupError(f"no JetStream stream {layout.stream} at {redact_url(url)}: no writer of deployment "
                              f"{server_name!r} has published there yet (check --server-name)") from None
        subjects, _, last_seq = await api.subjects()
        writers: list[dict[str, Any]] = []
        for subject, count in sorted(subjects.items()):
            last, cmds = await api.last_page(subject)
            if last is None:
                continue
            head = cmds[0] if cmds else None
            writers.append({
                "stream": getattr(head, "stream_name", None),
                "writer": getattr(head, "instance_name", None),
                "subject": subject,
                "messages": count,
                "sequence": last.seq,
                "token": page_end(cmds, _prev_of(last.headers)),
                "last_at": last.time or None,
            })
        named = {w["subject"]: (w["stream"], w["writer"]) for w in writers}
        now = time.time()
        readers: list[dict[str, Any]] = []
        for c in await api.consumers():
            description = str(c.get("config", {}).get("description") or "")
            if not description.startswith(CONSUMER_PREFIX):
                continue
            role, _, name = description[len(CONSUMER_PREFIX):].partition(" ")
            delivered = int(c.get("delivered", {}).get("stream_seq", 0) or 0)
            pending = int(c.get("num_pending", 0) or 0)
            by_subject = await behind_by_subject(api, delivered, named, pending, now)
            lags = [s["lag_seconds"] for s in by_subject]
            # The reader's lag is its oldest pending message's age: the largest of its subjects'.
            lag = None if None in lags else max(lags, default=0.0)
            readers.append({
                "name": name or role,
                "role": role,
                "consumer": c.get("name"),
                "sequence": delivered,
                "pending": pending,
                "lag_seconds": lag,
                "last_active": c.get("delivered", {}).get("last_active"),
                "streams": by_subject,
            })
        state = info.get("state", {})
        return {
            "stream": layout.stream,
            "messages": int(state.get("messages", 0) or 0),
            "bytes": int(state.get("bytes", 0) or 0),
            "last_seq": last_seq,
            "writers": writers,
            "readers": sorted(readers, key=lambda r: (r["role"], r["name"], r["consumer"] or "")),
        }
    finally:
        await nc.close()
