"""The fetch side channel: readers fetch missed facts of in-memory streams from the writer.

One JSON request line, one JSON answer line, on its own port beside the
replication listener (:class:`FetchServer` on the writer,
:class:`RemoteUpdateSource` on a reader, used by its follower's catch-up).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl as _ssl
from collections.abc import Mapping
from typing import Any

from .. import _json
from ..errors import FactstreamError
from ..streams.rows import Row
from ..streams.sources import Updates, UpdateSource

__all__ = ["FetchError", "FetchServer", "RemoteUpdateSource"]

log = logging.getLogger("factstream.transport.tcp")


class FetchError(FactstreamError):
    """The writer could not answer a catch-up fetch."""


class FetchServer:
    """Answers catch-up fetches for in-memory streams: one JSON line in, one out (loopback by default)."""

    def __init__(
        self, sources: Mapping[str, UpdateSource], *, host: str = "127.0.0.1", port: int = 0,
        ssl: _ssl.SSLContext | None = None, max_limit: int = 10_000,
    ) -> None:
        self.sources = dict(sources)
        self.host = host
        self.port = port
        self.ssl = ssl
        self.max_limit = max_limit
        self._server: asyncio.Server | None = None

    async def start(self) -> FetchServer:
        """Start listening; ``self.port`` is the bound port."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.ssl, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                writer.write(_json.dumps(await self._answer(line)).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            req = json.loads(line)
            stream, instance = str(req["stream"]), str(req["instance"])
            start, upto, limit = int(req["from"]), int(req["upto"]), min(int(req["limit"]), self.max_limit)
        except (ValueError, KeyError, TypeError) as err:
            return {"error": f"bad request: {err}"}
        source = self.sources.get(stream)
        if source is None:
            return {"error": f"stream {stream!r} is not served here (have: {', '.join(sorted(self.sources))})"}
        try:
            updates, upto_token, limited = await source.get_updates(instance, start, upto, limit)
        except Exception as err:
            return {"error": f"{type(err).__name__}: {err}"}
        return {
            "updates": [[t, r.to_wire() if isinstance(r, Row) else r] for t, r in updates],
            "upto": upto_token,
            "limited": limited,
        }


class RemoteUpdateSource:
    """An update source that asks a writer's :class:`FetchServer` (for in-memory streams)."""

    def __init__(
        self, stream: str, host: str, port: int, *, ssl: _ssl.SSLContext | None = None, timeout: float = 10.0
    ) -> None:
        self.stream = stream
        self.host = host
        self.port = port
        self.ssl = ssl
        self.timeout = timeout

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        req = {"stream": self.stream, "instance": instance_name, "from": from_token, "upto": upto_token, "limit": limit}
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=1 << 24), self.timeout
        )
        try:
            writer.write(_json.dumps(req).encode() + b"\n")
            line = await asyncio.wait_for(reader.readline(), self.timeout)
        finally:
            writer.close()
        if not line:
            raise FetchError(f"writer at {self.host}:{self.port} closed the fetch connection")
        answer = json.loads(line)
        if "error" in answer:
            raise FetchError(f"writer at {self.host}:{self.port} refused the fetch: {answer['error']}")
        return [(int(t), r) for t, r in answer["updates"]], int(answer["upto"]), bool(answer["limited"])
