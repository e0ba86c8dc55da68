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
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0-65535, got {port}")
        if max_limit < 1:
            raise ValueError(f"max_limit must be at least 1 row, got {max_limit}")
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
    """An update source that asks a writer's :class:`FetchServer` (for in-memory streams).

    Every failure (nothing listening, no answer within ``timeout`` seconds,
    an answer that is not one) is a :class:`FetchError` naming the writer's
    address, which the follower logs before it tries again.
    """

    def __init__(
        self, stream: str, host: str, port: int, *, ssl: _ssl.SSLContext | None = None, timeout: float = 10.0
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0-65535, got {port}")
        if not timeout > 0:  # also refuses NaN
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.stream = stream
        self.host = host
        self.port = port
        self.ssl = ssl
        self.timeout = timeout

    async def get_updates(self, instance_name: str, from_token: int, upto_token: int, limit: int) -> Updates:
        req = {"stream": self.stream, "instance": instance_name, "from": from_token, "upto": upto_token, "limit": limit}
        where = f"writer's fetch port {self.host}:{self.port}"
        writer: asyncio.StreamWriter | None = None
        try:
            # One deadline over connect, request and answer; asyncio.timeout rather than wait_for, whose
            # inner task can finish connecting just as it times out and leave that connection open.
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=1 << 24)
                writer.write(_json.dumps(req).encode() + b"\n")
                line = await reader.readline()
        except TimeoutError:
            raise FetchError(f"{where} did not answer a {self.stream} fetch within {self.timeout:g}s") from None
        except (OSError, ValueError) as err:  # ValueError: an answer line past the reader's limit
            raise FetchError(f"{where}: {type(err).__name__}: {err}") from None
        finally:
            if writer is not None:
                writer.close()
        if not line:
            raise FetchError(f"{where} closed the fetch connection without an answer")
        try:
            answer = json.loads(line)
            if "error" in answer:
                raise FetchError(f"{where} refused the {self.stream} fetch: {answer['error']}")
            return [(int(t), r) for t, r in answer["updates"]], int(answer["upto"]), bool(answer["limited"])
        except (ValueError, KeyError, TypeError) as err:
            raise FetchError(f"{where} answered something that is not a fetch answer ({err}): {line[:80]!r}") from None
