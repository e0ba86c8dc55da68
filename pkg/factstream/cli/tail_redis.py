"""``factstream tail --redis``: print a live deployment's replication traffic, decoded."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from typing import IO

from .. import wire
from ..commands import Command, command_to_json
from ..transport.redis import RedisCarrier, RedisCarrierStats

__all__ = ["tail_redis"]


def _stream_of(cmd: Command) -> str | None:
    return getattr(cmd, "stream_name", None)


async def tail_redis(
    url: str,
    server_name: str,
    streams: Sequence[str] = (),
    json_output: bool = False,
    *,
    user_ip: bool = False,
    replicate: bool = False,
    out: IO[str] | None = None,
    limit: int | None = None,
    stop: asyncio.Event | None = None,
    seen: Callable[[Command], None] | None = None,
) -> RedisCarrierStats:
    """Print a live deployment's replication traffic, decoded, until cancelled.

    ``streams`` keeps only RDATA/POSITION of those streams (other commands
    always show). ``json_output`` prints one JSON object per line instead of
    the wire line. ``user_ip`` also subscribes to ``<server_name>/USER_IP``.
    ``replicate`` publishes REPLICATE once subscribed, so writers announce
    their positions (otherwise tail only listens). Stops after ``limit``
    commands or when ``stop`` is set; returns the carrier's counters.
    ``seen`` is given every command heard, before the ``streams`` filter.
    """
    out = out or sys.stdout
    wanted = frozenset(streams)
    done = stop or asyncio.Event()
    shown = 0

    def show(cmd: Command) -> None:
        nonlocal shown
        if seen is not None:
            seen(cmd)
        stream = _stream_of(cmd)
        if wanted and stream is not None and stream not in wanted:
            return
        if json_output:
            out.write(json.dumps(command_to_json(cmd), separators=(",", ":")) + "\n")
        else:
            out.write(wire.encode(cmd).decode("utf-8", "replace") + "\n")
        out.flush()
        shown += 1
        if limit is not None and shown >= limit:
            done.set()

    carrier: RedisCarrier

    def subscribed() -> None:
        if replicate:
            carrier.send(wire.ReplicateCommand())

    carrier = RedisCarrier(
        url, server_name, on_command=show, on_subscribed=subscribed,
        subscribe_user_ip=user_ip, client_name="factstream-tail",
    )
    async with carrier:
        await done.wait()
    return carrier.stats
