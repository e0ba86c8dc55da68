"""``factstream tail --nats``: print a deployment's JetStream log, decoded."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from typing import IO
from urllib.parse import unquote

from ... import wire
from ...errors import ProtocolError
from ...redaction import redact_url
from .client import _Api, _ApiError, connect_nats
from .consumer import _LogConsumer
from .layout import JetStreamLayout, NatsStats, _RateLimitedLog
from .pages import decode_page


async def require_stream(api: _Api, url: str, server_name: str) -> None:
    """LookupError (saying to check --server-name) when deployment ``server_name`` has no JetStream stream."""
    try:
        await api.request(f"STREAM.INFO.{api.layout.stream}")
    except _ApiError as err:
        if err.code != 404:
            raise
        raise LookupError(f"no JetStream stream {api.layout.stream} at {redact_url(url)}: no writer of deployment "
                          f"{server_name!r} has published there yet (check --server-name)") from None


async def logged_writers(api: _Api) -> list[tuple[str, str]]:
    """(stream, writer) of every log subject the deployment's stream holds: who ever published there."""
    subjects, _, _ = await api.subjects()
    head = api.layout.log_subjects[:-1]  # "<prefix>.log."
    out = []
    for subject in subjects:
        stream, _, writer = subject[len(head):].partition(".") if subject.startswith(head) else ("", "", "")
        if stream and writer:
            out.append((unquote(stream), unquote(writer)))
    return out


async def tail_nats(
    url: str,
    server_name: str,
    streams: Sequence[str] = (),
    json_output: bool = False,
    *,
    from_start: bool = False,
    out: IO[str] | None = None,
    limit: int | None = None,
    stop: asyncio.Event | None = None,
    stream: str | None = None,
    announced: Callable[[list[tuple[str, str]]], None] | None = None,
) -> NatsStats:
    """Print the deployment's log as it grows (``from_start``: from its oldest retained message).

    Raises LookupError when the deployment has no stream there. Each message
    is a page of lines; they are printed one per line as the codec writes them
    (``json_output``: one JSON object per command, with its message's
    JetStream sequence). ``streams`` keeps only those streams. Stops after
    ``limit`` lines or when ``stop`` is set. ``announced`` is given the
    (stream, writer) pairs the log holds, once, before the first line.
    """
    from ...commands import command_to_json

    out = out or sys.stdout
    layout = JetStreamLayout.for_server(server_name, stream=stream)
    wanted = frozenset(streams)
    done = stop or asyncio.Event()
    stats = NatsStats()
    shown = 0
    invalid_log = _RateLimitedLog()

    def show(subject: str, data: bytes, headers: bytes | None, seq: int, ts: int, pending: int) -> None:
        nonlocal shown
        if done.is_set():
            return
        stats.received += 1
        try:
            cmds = decode_page(data)
        except ProtocolError as err:
            stats.invalid += 1
            invalid_log.warning("invalid message %d on %s skipped: %s", seq, subject, err)
            return
        stats.rows_received += len(cmds)
        for cmd in cmds:
            name = getattr(cmd, "stream_name", None)
            if wanted and name is not None and name not in wanted:
                continue
            if json_output:
                out.write(json.dumps({"seq": seq, **command_to_json(cmd)}, separators=(",", ":")) + "\n")
            else:
                out.write(wire.encode(cmd).decode("utf-8", "replace") + "\n")
            shown += 1
            if limit is not None and shown >= limit:
                done.set()
                break
        out.flush()

    nc = await connect_nats(url, name="factstream-tail")
    try:
        api = _Api(nc, layout)
        await require_stream(api, url, server_name)
        if announced is not None:
            announced(await logged_writers(api))
        consumer = _LogConsumer(api, show, stats, deliver_new=not from_start, description="factstream tail")
        consumer.start()
        await done.wait()
        await consumer.close()
    finally:
        await nc.close()
    return stats
