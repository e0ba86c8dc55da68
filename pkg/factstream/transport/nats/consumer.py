"""Reading a JetStream stream in order: one ordered consumer per reader, resumed by sequence.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...backoff import backoff_delay
from .client import _Api, _fast_subscribe, _raw_headers
from .layout import _NS, MSG_ID, PREV, NatsStats

logger = logging.getLogger("factstream.transport.nats")

Delivery = Callable[[str, bytes, "bytes | None", int, int, int], None]


class _LogConsumer:
    """An ephemeral push consumer over the log subjects, kept complete and in order by hand.

    ``deliver(subject, data, raw_headers, stream_seq, timestamp_ns, pending)`` is
    called for every message in stream-sequence order, each once. A consumer
    sequence gap, ``silence`` seconds without any delivery or heartbeat, or a
    reconnect make it recreate the consumer from the sequence after the last
    message delivered. ``start_seq`` is awaited on every (re)creation that has
    nothing delivered yet. ``description`` ("factstream <role> <instance>")
    names the consumer for ``factstream status --nats``.
    """

    def __init__(self, api: _Api, deliver: Delivery, stats: NatsStats, *, heartbeat: float = 1.0,
                 start_seq: Callable[[], Awaitable[int]] | None = None, deliver_new: bool = False,
                 description: str = "factstream reader") -> None:
        self.api = api
        self.description = description
        self.deliver = deliver
        self.stats = stats
        self.heartbeat = heartbeat
        self._start_seq = start_seq
        self._deliver_new = deliver_new
        self.last_seq = 0  #: stream sequence of the last message delivered (0: none yet)
        self.pending = 0
        self._cseq = 0
        self._sub: Any = None
        self._name: str | None = None
        self._last_activity = time.monotonic()
        self._reset = asyncio.Event()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._generation = 0
        self.reset_reasons: list[str] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="factstream-nats-consumer")

    def reset(self, reason: str) -> None:
        """Recreate the consumer from the sequence after the last message delivered."""
        if not self._reset.is_set():
            logger.info("JetStream consumer on %s: %s; recreating it after sequence %d",
                        self.api.layout.stream, reason, self.last_seq)
            self.reset_reasons.append(reason)
        self._reset.set()
        self._ready.clear()

    async def wait_ready(self, timeout: float | None) -> None:
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing
                pass
        await self._drop()

    async def _drop(self) -> None:
        sub, self._sub = self._sub, None
        name, self._name = self._name, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - connection may be gone
                pass
        if name is not None and self.api.nc.is_connected:
            await self.api.delete_consumer(name)

    async def _run(self) -> None:
        attempt = 0
        first = True
        while not self._closing:
            try:
                await self._create(first)
                first = False
                attempt = 0
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - JetStream down or electing: retry
                delay = backoff_delay(attempt, 0.05, 2.0)
                attempt += 1
                logger.warning("cannot create the JetStream consumer on %s (%s); retrying in %.2fs",
                               self.api.layout.stream, err, delay)
                await self._drop()
                await asyncio.sleep(delay)
                continue
            # Watch: heartbeats every `heartbeat` s; silence or a requested reset recreates.
            while not self._closing:
                try:
                    await asyncio.wait_for(self._reset.wait(), self.heartbeat)
                except TimeoutError:
                    pass
                if self._reset.is_set():
                    break
                if time.monotonic() - self._last_activity > 3 * self.heartbeat + 1:
                    self.reset(f"no message or heartbeat for {3 * self.heartbeat + 1:g}s")
                    break
            self.stats.consumer_resets += 1
            await self._drop()

    async def _create(self, first: bool) -> None:
        self._reset.clear()
        nc = self.api.nc
        if not nc.is_connected:
            raise ConnectionError("not connected")
        config: dict[str, Any] = {
            "description": self.description,  # how `factstream status --nats` names this reader
            "ack_policy": "none",
            "filter_subject": self.api.layout.log_subjects,
            "flow_control": True,
            "idle_heartbeat": int(self.heartbeat * _NS),
            "inactive_threshold": int(max(30.0, 10 * self.heartbeat) * _NS),
            "mem_storage": True,
            "num_replicas": 1,
            "replay_policy": "instant",
        }
        if self.last_seq:
            start = self.last_seq + 1
        elif self._start_seq is not None:
            start = await self._start_seq()
        else:
            start = 0
        if start > 0:
            config["deliver_policy"] = "by_start_sequence"
            config["opt_start_seq"] = start
        else:
            config["deliver_policy"] = "new" if self._deliver_new else "all"
        inbox = nc.new_inbox()
        self._cseq = 0
        self._generation += 1
        generation = self._generation

        async def on_msg(msg: Any) -> None:
            if generation == self._generation:
                await self._on_msg(msg)

        def on_data(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            if generation == self._generation:
                self._on_data(subject, reply, data, headers)

        sub = self._sub = await _fast_subscribe(nc, inbox, on_data, on_msg)
        config["deliver_subject"] = inbox
        self._name = await self.api.create_consumer(config)
        self._last_activity = time.monotonic()
        self.stats.consumers_created += 1
        _ = sub
        self._ready.set()

    async def _on_msg(self, msg: Any) -> None:
        self._last_activity = time.monotonic()
        hdr = msg.headers
        reply = msg.reply
        if hdr is not None and "Status" in hdr:
            if reply:  # flow control request
                await self.api.nc.publish(reply)
                return
            stalled = hdr.get("Nats-Consumer-Stalled")
            if stalled:
                await self.api.nc.publish(stalled)
            last = hdr.get("Nats-Last-Consumer")
            if last is not None and last.isdigit() and int(last) > self._cseq:
                self.reset(f"heartbeat says {last} delivered, {self._cseq} received")
            return
        if not reply:
            return
        self._on_data(msg.subject.encode(), reply.encode(), msg.data, None, hdr)

    def _on_data(self, subject: bytes, reply: bytes, data: bytes, raw: bytes | None,
                 parsed: dict[str, str] | None = None) -> None:
        """One data message (the reply subject carries its stream and consumer sequences)."""
        self._last_activity = time.monotonic()
        if not reply:
            return
        tokens = reply.split(b".")
        try:
            if len(tokens) == 9:
                sseq, cseq, ts, pending = int(tokens[5]), int(tokens[6]), int(tokens[7]), int(tokens[8])
            else:
                sseq, cseq, ts, pending = int(tokens[7]), int(tokens[8]), int(tokens[9]), int(tokens[10])
        except (IndexError, ValueError):
            return
        if self._reset.is_set():
            return
        if cseq != self._cseq + 1:
            self.reset(f"consumer sequence jumped from {self._cseq} to {cseq}")
            return
        self._cseq = cseq
        if sseq <= self.last_seq:
            return  # already delivered (a recreated consumer starting early)
        self.last_seq = sseq
        self.pending = pending
        if parsed is not None:
            raw = _raw_headers(parsed.get(MSG_ID, ""), parsed.get(PREV, "")) if MSG_ID in parsed else None
        self.deliver(subject.decode(), data, raw, sseq, ts, pending)
