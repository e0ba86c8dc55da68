"""The Redis pub/sub carrier against real Redis servers.

Most tests use the shared Redis at 127.0.0.1:6379 with a channel prefix of
their own. Tests that stop, restart, freeze (SIGSTOP) or reconfigure Redis
start a private redis-server on a free port in a temporary directory and
kill it afterwards. Every scenario runs on the stdlib event loop and on uvloop.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from conftest import require, unavailable
from factstream import wire
from factstream.cli.tail_redis import tail_redis
from factstream.transport.redis import carrier as carrier_module
from factstream.transport.redis import (
    RedisCarrier,
    RedisChannels,
    backoff_delay,
    command_to_json,
    connection_kwargs_from_url,
    redacted_url,
)

pytestmark = pytest.mark.redis


# ------------------------------------------------------------------ helpers


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[Any]], Any]:
    """Run a coroutine to completion on the stdlib loop or on uvloop."""
    if request.param == "uvloop":
        uvloop = require(module="uvloop", how="pip install uvloop (a dependency of factstream)")
        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    else:
        factory = None

    def runner(coro: Awaitable[Any], timeout: float = 60.0) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(timeout):
                return await coro

        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(bounded())

    return runner


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private redis-server process: start, stop, restart, freeze, thaw."""

    def __init__(self, workdir: Path, *, password: str | None = None, tls: bool = False) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.socket_path = str(workdir / "redis.sock")
        self.password = password
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        if tls:
            self._make_cert()

    def _make_cert(self) -> None:
        openssl = require(binary="openssl", how="apt-get install openssl (make prerequisites)")
        subprocess.run(
            [
                openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                "-keyout", str(self.workdir / "key.pem"), "-out", str(self.workdir / "cert.pem"),
                "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            check=True, capture_output=True,
        )

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        redis_server = require(binary="redis-server", how="apt-get install redis-server (make prerequisites)")
        args = [
            redis_server, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.workdir), "--unixsocket", self.socket_path, "--unixsocketperm", "700",
        ]
        if self.tls:
            args += [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.workdir / "cert.pem"), "--tls-key-file", str(self.workdir / "key.pem"),
                "--tls-auth-clients", "no",
            ]
        else:
            args += ["--port", str(self.port)]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:  # e.g. another process took the port meanwhile
                raise RuntimeError(f"redis-server on port {self.port} exited with status {self.proc.returncode}")
            try:
                # The unix socket is ours alone: when it answers, this very process is listening.
                with socket.socket(socket.AF_UNIX) as unix:
                    unix.settimeout(0.2)
                    unix.connect(self.socket_path)
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.resume()
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


FAST = dict(ping_interval=0.2, ping_timeout=1.0, connect_timeout=1.0, backoff_initial=0.02, backoff_max=0.2)


def sample(name: str, **labels: str) -> float:
    """Current value of a Prometheus sample in the default registry (0 if absent)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def every_command(instance: str) -> list[wire.Command]:
    """One command of every type (USER_IP last), as Synapse would write them."""
    return [
        wire.ServerCommand("example.com"),
        wire.RdataCommand("events", instance, 54, ["$ev:hs", "!room:hs", "m.room.message", None, None, None]),
        wire.RdataCommand("caches", instance, None, ["get_user_by_id", ["@a:hs"], 1490197670513]),
        wire.PositionCommand("events", instance, 53, 54),
        wire.ErrorCommand("something went wrong"),
        wire.PingCommand("1490197665618"),
        wire.NameCommand("synapse.app.generic_worker"),
        wire.ReplicateCommand(),
        wire.UserSyncCommand("worker1", "@alice:hs", "DEV", True, 1490197665618),
        wire.UserSyncCommand("worker1", "@alice:hs", None, False, 1490197665619),
        wire.ClearUserSyncsCommand("worker1"),
        wire.FederationAckCommand(instance, 12),
        wire.RemoteServerUpCommand("other.example.org"),
        wire.LockReleasedCommand(instance, "lock", "key"),
        wire.NewActiveTaskCommand("task-1"),
        wire.CancelTaskCommand("task-2"),
        wire.UserIpCommand("@alice:hs", "syt_token", "10.0.0.1", "curl/8", "DEV", 1490197665618),
    ]


async def raw_client(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, protocol=2)


async def kill_client(url: str, client_id: int | None) -> None:
    assert client_id is not None
    r = await raw_client(url)
    try:
        assert await r.execute_command("CLIENT", "KILL", "ID", str(client_id)) == 1
    finally:
        await r.aclose()


# ------------------------------------------------------------------ pure functions


def test_backoff_delay_is_capped_exponential_with_jitter() -> None:
    rng = random.Random(7)
    for attempt in range(40):
        ceiling = min(5.0, 0.1 * 2**attempt)
        delays = [backoff_delay(attempt, 0.1, 5.0, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered
    assert backoff_delay(10_000, 0.1, 5.0) <= 5.0


def test_channel_layout_is_synapses() -> None:
    ch = RedisChannels.for_server("example.com")
    assert ch.main == "example.com"
    assert ch.user_ip == "example.com/USER_IP"
    assert ch.for_command("USER_IP") == "example.com/USER_IP"
    assert ch.for_command("RDATA") == "example.com"
    with pytest.raises(ValueError, match="server name"):
        RedisChannels.for_server("has space")


def test_urls_with_password_db_tls_and_unix_socket() -> None:
    cls, kw = connection_kwargs_from_url("redis://:s3cret@10.1.2.3:6380/4")
    assert cls.__name__ == "Connection"
    assert (kw["host"], kw["port"], kw["db"], kw["password"]) == ("10.1.2.3", 6380, 4, "s3cret")
    cls, kw = connection_kwargs_from_url("rediss://user:pw@redis.example:6390/0?ssl_cert_reqs=none")
    assert cls.__name__ == "SSLConnection"
    assert (kw["username"], kw["password"], kw["ssl_cert_reqs"]) == ("user", "pw", "none")
    cls, kw = connection_kwargs_from_url("unix:///run/redis/redis.sock?db=2&password=pw")
    assert cls.__name__ == "UnixDomainSocketConnection"
    assert (kw["path"], kw["db"], kw["password"]) == ("/run/redis/redis.sock", 2, "pw")
    with pytest.raises(ValueError, match="bad Redis URL"):
        connection_kwargs_from_url("http://localhost:6379")
    for path in ("abc", "0/extra"):  # redis-py took these as database 0 without a word
        with pytest.raises(ValueError, match="names the database by number") as err:
            connection_kwargs_from_url(f"redis://u:s3cret@h:1/{path}")
        assert "s3cret" not in str(err.value)
    assert connection_kwargs_from_url("redis://h:1/")[1].get("db") in (None, 0)
    with pytest.raises(ValueError, match="unsupported option"):
        RedisCarrier("redis://127.0.0.1:6379/0?no_such_option=1", "x")
    assert redacted_url("redis://:s3cret@h:1/0") == "redis://:***@h:1/0"
    assert redacted_url("redis://h:1/0") == "redis://h:1/0"


# ------------------------------------------------------------------ against the shared Redis


def test_every_command_type_round_trips(run: Any, redis_url: str, channel_prefix: str) -> None:
    async def scenario() -> None:
        plain: list[wire.Command] = []
        with_ip: list[wire.Command] = []
        sent = every_command("writer1")
        reader = RedisCarrier(redis_url, channel_prefix, on_command=plain.append, instance_name="reader", **FAST)
        reader_ip = RedisCarrier(
            redis_url, channel_prefix, on_command=with_ip.append, instance_name="reader2",
            subscribe_user_ip=True, **FAST,
        )
        writer = RedisCarrier(redis_url, channel_prefix, instance_name="writer1", **FAST)
        out_before = sample("factstream_commands_out_total", command="USER_SYNC")
        in_before = sample("factstream_commands_in_total", command="USER_SYNC")
        async with reader, reader_ip, writer:
            await reader.wait_subscribed(5)
            await reader_ip.wait_subscribed(5)
            await writer.wait_subscribed(5)  # its own subscriber counts what it hears too (below)
            assert writer.send_many(sent) == len(sent)
            await writer.flush(5)
            await eventually(lambda: len(with_ip) == len(sent), what="all commands")
            await eventually(lambda: len(plain) == len(sent) - 1, what="all but USER_IP")
            # The writer's own subscriber hears them too, at its own pace.
            await eventually(
                lambda: sample("factstream_commands_in_total", command="USER_SYNC") - in_before >= 6,
                what="the writer's own subscriber heard both USER_SYNC",
            )
        assert with_ip == sent  # equal values, same order
        assert plain == sent[:-1]  # USER_IP is opt-in
        assert writer.stats.published == len(sent) and writer.stats.round_trips == 1
        assert reader.stats.invalid == reader_ip.stats.invalid == 0
        # Prometheus: two USER_SYNC out; six in (each of the three carriers hears both, the writer included).
        assert sample("factstream_commands_out_total", command="USER_SYNC") - out_before == 2
        assert sample("factstream_commands_in_total", command="USER_SYNC") - in_before == 6

    run(scenario())


def test_wire_format_on_redis_is_synapses(run: Any, redis_url: str, channel_prefix: str) -> None:
    """Exact bytes on the exact channels, and lines published by others are decoded."""

    async def scenario() -> None:
        raw = await raw_client(redis_url)
        pubsub = raw.pubsub()
        await pubsub.subscribe(channel_prefix, f"{channel_prefix}/USER_IP")
        got: list[wire.Command] = []
        carrier = RedisCarrier(redis_url, channel_prefix, on_command=got.append, subscribe_user_ip=True, **FAST)
        async with carrier:
            await carrier.wait_subscribed(5)
            carrier.send(wire.RdataCommand("events", "master", 14, ["$149019767112vOHxz:localhost:8823", None]))
            carrier.send(wire.UserIpCommand("@u:hs", "tok", "1.2.3.4", "ua", None, 5))
            seen = []
            while len(seen) < 2:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
                if msg is not None:
                    seen.append((msg["channel"], msg["data"]))
            assert seen == [
                (channel_prefix.encode(), b'RDATA events master 14 ["$149019767112vOHxz:localhost:8823",null]'),
                (f"{channel_prefix}/USER_IP".encode(), b'USER_IP @u:hs ["tok","1.2.3.4","ua",null,5]'),
            ]
            # A Synapse-written line published by another client.
            await raw.publish(channel_prefix, b"POSITION events master 53 53")
            await raw.publish(f"{channel_prefix}/USER_IP", b'USER_IP @v:hs ["t","::1","ua","D",6]')
            await eventually(lambda: len(got) >= 4, what="decoded commands")
        assert got[2:] == [
            wire.PositionCommand("events", "master", 53, 53),
            wire.UserIpCommand("@v:hs", "t", "::1", "ua", "D", 6),
        ]
        await pubsub.aclose()
        await raw.aclose()

    run(scenario())


def test_own_echoes_are_ignored_by_instance_name(run: Any, redis_url: str, channel_prefix: str) -> None:
    async def scenario() -> None:
        got: list[wire.Command] = []
        me = RedisCarrier(redis_url, channel_prefix, on_command=got.append, instance_name="w1", **FAST)
        async with me:
            await me.wait_subscribed(5)
            me.send_many(
                [
                    wire.RdataCommand("events", "w1", 5, ["own"]),
                    wire.PositionCommand("events", "w1", 4, 5),
                    wire.LockReleasedCommand("w1", "l", "k"),
                    wire.RdataCommand("events", "w2", 7, ["other"]),
                    wire.PositionCommand("events", "w2", 6, 7),
                    wire.LockReleasedCommand("w2", "l", "k"),
                    wire.FederationAckCommand("w1", 3),  # not an echo-suppressed command
                ]
            )
            await eventually(lambda: len(got) == 4, what="non-echo commands")
            await asyncio.sleep(0.1)
        assert [c.NAME for c in got] == ["RDATA", "POSITION", "LOCK_RELEASED", "FEDERATION_ACK"]
        assert all(getattr(c, "instance_name") == "w2" for c in got[:3])
        assert me.stats.echoes == 3

    run(scenario())


def test_invalid_messages_are_counted_and_skipped(
    run: Any, redis_url: str, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        got: list[wire.Command] = []

        def handler(cmd: wire.Command) -> None:
            if isinstance(cmd, wire.PingCommand) and cmd.data == "boom":
                raise RuntimeError("handler bug")
            got.append(cmd)

        carrier = RedisCarrier(redis_url, channel_prefix, on_command=handler, **FAST)
        raw = await raw_client(redis_url)
        async with carrier:
            await carrier.wait_subscribed(5)
            for bad in (b"NOPE what", b"RDATA events", b"POSITION a b c d", b"\xff\xfe garbage", b"RDATA e w 1 [unclosed"):
                await raw.publish(channel_prefix, bad)
            await raw.publish(channel_prefix, b"")  # blank: ignored, not invalid
            await raw.publish(channel_prefix, b"PING boom")
            await raw.publish(channel_prefix, b"REMOTE_SERVER_UP still.alive")
            await eventually(lambda: len(got) == 1, what="the valid command")
            assert carrier.subscribed
        await raw.aclose()
        assert got == [wire.RemoteServerUpCommand("still.alive")]
        assert carrier.stats.invalid == 5
        assert carrier.stats.handler_errors == 1
        assert carrier.stats.subscriber_failures == 0

    with caplog.at_level(logging.WARNING, logger="factstream.transport.redis"):
        run(scenario())
    assert "ignoring invalid replication message" in caplog.text
    assert "handler failed" in caplog.text


def test_replicate_goes_out_only_after_subscription_is_confirmed(
    run: Any, redis_url: str, channel_prefix: str
) -> None:
    """REPLICATE published from on_subscribed is heard by the publisher's own subscription."""

    async def scenario() -> None:
        got: list[wire.Command] = []
        carrier: RedisCarrier

        def subscribed() -> None:
            assert carrier.subscribed
            carrier.send(wire.ReplicateCommand())

        carrier = RedisCarrier(redis_url, channel_prefix, on_command=got.append, on_subscribed=subscribed, **FAST)
        async with carrier:
            await eventually(lambda: got == [wire.ReplicateCommand()], what="own REPLICATE")

    for _ in range(3):  # a race would show up now and then
        run(scenario())


def test_commands_queued_in_one_tick_go_out_in_one_round_trip(run: Any, redis_url: str, channel_prefix: str) -> None:
    async def scenario(pipelining: bool) -> tuple[int, list[int]]:
        got: list[int] = []
        reader = RedisCarrier(redis_url, channel_prefix, on_command=lambda c: got.append(c.token), **FAST)
        writer = RedisCarrier(redis_url, channel_prefix, pipelining=pipelining, **FAST)
        async with reader, writer:
            await reader.wait_subscribed(5)
            await writer.wait_subscribed(5)
            before = writer.stats.round_trips
            for i in range(1, 2001):
                writer.send(wire.RdataCommand("events", "w", i, [i]))
            await writer.flush(10)
            trips = writer.stats.round_trips - before
            await eventually(lambda: len(got) == 2000, what="2000 commands")
        return trips, got

    trips, got = run(scenario(True))
    assert trips == 1
    assert got == list(range(1, 2001))
    trips, got = run(scenario(False))
    assert trips == 2000
    assert got == list(range(1, 2001))


def test_client_kill_of_either_connection_reconnects(run: Any, redis_url: str, channel_prefix: str) -> None:
    async def scenario() -> None:
        got: list[wire.Command] = []
        subscribed = resyncs = 0

        def on_subscribed() -> None:
            nonlocal subscribed
            subscribed += 1

        def on_resync() -> None:
            nonlocal resyncs
            resyncs += 1

        reader = RedisCarrier(redis_url, channel_prefix, on_command=got.append, on_subscribed=on_subscribed, **FAST)
        writer = RedisCarrier(redis_url, channel_prefix, on_resync=on_resync, **FAST)
        async with reader, writer:
            await reader.wait_subscribed(5)
            await kill_client(redis_url, reader.subscriber_client_id)
            await eventually(lambda: subscribed == 2, what="resubscription")
            assert reader.stats.subscriber_failures == reader.stats.subscriber_losses == 1
            await kill_client(redis_url, writer.publisher_client_id)
            await eventually(lambda: writer.stats.publisher_connects == 2, what="publisher reconnect")
            writer.send(wire.PingCommand("after"))
            await writer.flush(5)
            await eventually(lambda: wire.PingCommand("after") in got, what="delivery after both kills")
            assert resyncs == 1  # positions are re-announced after a publisher reconnect

    run(scenario())


def test_tail_prints_decoded_traffic(run: Any, redis_url: str, channel_prefix: str) -> None:
    async def scenario(json_output: bool) -> str:
        out = io.StringIO()
        stop = asyncio.Event()
        task = asyncio.create_task(
            tail_redis(redis_url, channel_prefix, ["events"], json_output, out=out, limit=3, stop=stop)
        )
        raw = await raw_client(redis_url)
        # tail subscribes in the background; publish until it has heard the first message
        while not out.getvalue():
            await raw.publish(channel_prefix, b"REMOTE_SERVER_UP first")
            await asyncio.sleep(0.02)
        await raw.publish(channel_prefix, b"RDATA caches master 3 [\"c\",null,1]")  # filtered out
        await raw.publish(channel_prefix, b'RDATA events master 4 ["$e:hs",null]')
        await raw.publish(channel_prefix, b"POSITION events master 4 4")
        stats = await task
        await raw.aclose()
        assert stats.received >= 4
        return out.getvalue()

    text = run(scenario(False))
    lines = text.splitlines()
    assert lines[-2:] == ['RDATA events master 4 ["$e:hs",null]', "POSITION events master 4 4"]
    text = run(scenario(True))
    objs = [json.loads(line) for line in text.splitlines()]
    assert objs[-2] == {"command": "RDATA", "stream_name": "events", "instance_name": "master", "token": 4, "row": ["$e:hs", None]}
    assert objs[-1] == command_to_json(wire.PositionCommand("events", "master", 4, 4))


# ------------------------------------------------------------------ against a private redis-server


def test_publishing_while_redis_is_down_is_bounded(
    run: Any, private_redis: RedisServer, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    private_redis.stop()

    async def scenario() -> None:
        resyncs = 0

        def on_resync() -> None:
            nonlocal resyncs
            resyncs += 1

        got: list[int] = []
        writer = RedisCarrier(private_redis.url, channel_prefix, max_pending=100, on_resync=on_resync, **FAST)
        pending_before = sample("factstream_pending_outbound")
        async with writer:
            accepted = [writer.send(wire.RdataCommand("s", "w", i, [i])) for i in range(1, 151)]
            assert accepted == [True] * 100 + [False] * 50
            assert writer.pending == 100
            assert writer.stats.dropped == 50 and writer.stats.overflows == 1
            await asyncio.sleep(0.3)  # still down: nothing more is queued, nothing grows
            assert not writer.publisher_connected and writer.pending == 100
            assert sample("factstream_pending_outbound") - pending_before == 100  # reported while retrying
            private_redis.start()
            reader = RedisCarrier(private_redis.url, channel_prefix, on_command=lambda c: got.append(c.token), **FAST)
            async with reader:
                await eventually(lambda: writer.pending == 0, what="queue flushed after Redis came back")
                await eventually(
                    lambda: sample("factstream_pending_outbound") == pending_before, what="pending gauge back"
                )
                await eventually(lambda: resyncs == 1, what="resync after the overflow")
                assert writer.stats.published == 100
                # Once drained, new commands are accepted again.
                await reader.wait_subscribed(5)
                assert writer.send(wire.RdataCommand("s", "w", 151, [151]))
                await eventually(lambda: 151 in got, what="delivery after recovery")

    with caplog.at_level(logging.ERROR, logger="factstream.transport.redis"):
        run(scenario())
    assert "publish queue full" in caplog.text


def test_redis_restarted_mid_stream(run: Any, private_redis: RedisServer, channel_prefix: str) -> None:
    """Both connections of both instances come back; what arrives arrives in order."""

    async def scenario() -> None:
        got: list[int] = []
        subscribed = 0

        def on_subscribed() -> None:
            nonlocal subscribed
            subscribed += 1

        reader = RedisCarrier(
            private_redis.url, channel_prefix, on_command=lambda c: got.append(c.token),
            on_subscribed=on_subscribed, **FAST,
        )
        writer = RedisCarrier(private_redis.url, channel_prefix, **FAST)
        async with reader, writer:
            await reader.wait_subscribed(5)
            token = 0

            async def produce(n: int) -> None:
                nonlocal token
                for _ in range(n):
                    token += 1
                    writer.send(wire.RdataCommand("s", "w", token, [token]))
                    await asyncio.sleep(0.001)

            await produce(200)
            await eventually(lambda: len(got) == 200, what="first 200")
            private_redis.stop()
            await produce(100)  # published into the void or queued
            await asyncio.sleep(0.3)
            private_redis.start()
            await eventually(lambda: subscribed == 2 and writer.publisher_connected, timeout=15, what="reconnects")
            mark = token
            await produce(200)
            await eventually(lambda: got[-1:] == [token], what="last token after restart")
        assert got == sorted(set(got))  # no duplicates, no reordering
        assert set(range(mark + 1, token + 1)) <= set(got)  # everything after the reconnect arrived
        assert reader.stats.subscriber_failures >= 1 and writer.stats.publisher_failures >= 1

    run(scenario())


def test_health_check_finds_a_frozen_redis(run: Any, private_redis: RedisServer, channel_prefix: str) -> None:
    """SIGSTOP keeps the TCP connection open but silent: only PING can tell."""

    async def scenario() -> None:
        got: list[wire.Command] = []
        carrier = RedisCarrier(private_redis.url, channel_prefix, on_command=got.append, **FAST)
        async with carrier:
            await carrier.wait_subscribed(5)
            private_redis.pause()
            try:
                await eventually(
                    lambda: carrier.stats.health_check_failures >= 2 and not carrier.subscribed
                    and not carrier.publisher_connected,
                    timeout=10, what="both connections declared dead",
                )
            finally:
                private_redis.resume()
            await carrier.wait_subscribed(10)
            await eventually(lambda: carrier.publisher_connected, what="publisher back")
            carrier.send(wire.PingCommand("thawed"))
            await eventually(lambda: got[-1:] == [wire.PingCommand("thawed")], what="delivery after thaw")

    run(scenario())


def test_password_database_and_unix_socket(run: Any, tmp_path: Path, channel_prefix: str) -> None:
    server = RedisServer(tmp_path, password="s3cr/et")
    server.start()
    try:
        urls = [
            f"redis://:s3cr%2Fet@127.0.0.1:{server.port}/3",
            f"unix://{server.socket_path}?db=2&password=s3cr%2Fet",
        ]

        async def scenario(url: str) -> None:
            got: list[wire.Command] = []
            carrier = RedisCarrier(url, channel_prefix, on_command=got.append, **FAST)
            async with carrier:
                await carrier.wait_subscribed(5)
                carrier.send(wire.PingCommand("ok"))
                await eventually(lambda: got == [wire.PingCommand("ok")], what="round trip")

        for url in urls:
            run(scenario(url))
    finally:
        server.stop()


def test_wrong_password_keeps_retrying_loudly(
    run: Any, tmp_path: Path, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path, password="right")
    server.start()
    try:

        async def scenario() -> None:
            carrier = RedisCarrier(f"redis://:wrong@127.0.0.1:{server.port}/0", channel_prefix, **FAST)
            async with carrier:
                await eventually(lambda: carrier.stats.subscriber_failures >= 3, what="several attempts")
                assert not carrier.subscribed and carrier.stats.subscriber_losses == 0  # never subscribed

        with caplog.at_level(logging.WARNING, logger="factstream.transport.redis"):
            run(scenario())
    finally:
        server.stop()
    assert "AuthenticationError" in caplog.text or "invalid username-password" in caplog.text.lower()
    assert "wrong" not in caplog.text  # the password never reaches the logs


def test_tls(run: Any, tmp_path: Path, channel_prefix: str) -> None:
    server = RedisServer(tmp_path, tls=True)
    try:
        server.start()
    except RuntimeError as err:
        unavailable(f"redis-server did not start with TLS ({err}); is it built with TLS support?")
    try:

        async def scenario() -> None:
            got: list[wire.Command] = []
            url = f"{server.url}?ssl_ca_certs={tmp_path / 'cert.pem'}"
            carrier = RedisCarrier(url, channel_prefix, on_command=got.append, **FAST)
            async with carrier:
                await carrier.wait_subscribed(5)
                carrier.send(wire.PingCommand("over tls"))
                await eventually(lambda: got == [wire.PingCommand("over tls")], what="round trip over TLS")

        run(scenario())
    finally:
        server.stop()


# ------------------------------------------------------------------ batches: write-through, refusals, losses


def test_send_many_writes_full_chunks_at_once_and_stops_at_a_bad_command(
    run: Any, redis_url: str, channel_prefix: str
) -> None:
    """Full chunks go straight onto the connection; a bad command raises, the ones before it are published."""
    chunk = carrier_module.CHUNK
    good = 2 * chunk + 5

    async def scenario() -> None:
        got: list[int] = []
        reader = RedisCarrier(redis_url, channel_prefix, on_command=lambda c: got.append(c.token), **FAST)
        writer = RedisCarrier(redis_url, channel_prefix, listen=False, **FAST)
        async with reader, writer:
            await reader.wait_subscribed(5)
            await eventually(lambda: writer.publisher_connected, what="publisher up")
            cmds: list[wire.Command] = [wire.RdataCommand("s", "w", i, [i]) for i in range(1, 3 * chunk + 1)]
            cmds[good] = wire.RdataCommand("s", "has space", good + 1, [0])
            before = writer.stats.round_trips
            with pytest.raises(wire.ProtocolError, match="instance_name must be non-empty with no spaces"):
                writer.send_many(cmds)
            # two full chunks already written (acknowledged later), the five before the bad one queued
            assert writer.stats.round_trips - before == 2 and writer.pending == good
            await writer.flush(10)
            assert writer.stats.round_trips - before == 3
            assert writer.stats.published == good and writer.stats.queued == good and writer.pending == 0
            await eventually(lambda: len(got) == good, what=f"{good} commands")
        assert got == list(range(1, good + 1))

    run(scenario())


def test_redis_refusing_publish_is_counted_and_the_rest_goes_through(
    run: Any, private_redis: RedisServer, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An ACL that forbids the USER_IP channel: those PUBLISHes fail (counted, logged), the others arrive."""
    sent = [
        wire.UserIpCommand("@u:hs", "tok", "10.0.0.1", "ua", None, i) if i % 10 == 0 else wire.RdataCommand("s", "w", i, [i])
        for i in range(1, 3001)
    ]

    async def scenario() -> None:
        admin = await raw_client(private_redis.url)
        await admin.execute_command("ACL", "SETUSER", "pub", "on", ">pw", "resetchannels", f"&{channel_prefix}", "+@all")
        await admin.aclose()
        got: list[wire.Command] = []
        reader = RedisCarrier(private_redis.url, channel_prefix, on_command=got.append, subscribe_user_ip=True, **FAST)
        url = f"redis://pub:pw@127.0.0.1:{private_redis.port}/0"
        writer = RedisCarrier(url, channel_prefix, listen=False, **FAST)
        async with reader, writer:
            await reader.wait_subscribed(5)
            await eventually(lambda: writer.publisher_connected, what="publisher up")
            assert writer.send_many(sent) == len(sent)
            await writer.flush(10)
            assert (writer.stats.published, writer.stats.publish_errors) == (2700, 300)
            assert writer.publisher_connected and writer.stats.publisher_failures == 0
            await eventually(lambda: len(got) == 2700, what="the permitted commands")
        assert got == [c for c in sent if c.NAME != "USER_IP"]

    with caplog.at_level(logging.ERROR, logger="factstream.transport.redis"):
        run(scenario())
    refused = [r for r in caplog.records if "refused PUBLISH" in r.getMessage()]
    assert refused and "no permissions" in refused[0].getMessage()
    assert len(refused) < 5  # rate-limited, not one line per refusal


def test_connection_lost_with_chunks_in_flight_is_counted_then_resynced(
    run: Any, private_redis: RedisServer, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis holds the PUBLISHes (CLIENT PAUSE WRITE) and the connection is killed: all of them count as lost."""
    n = 3 * carrier_module.CHUNK

    async def scenario() -> None:
        resyncs = 0

        def on_resync() -> None:
            nonlocal resyncs
            resyncs += 1

        writer = RedisCarrier(private_redis.url, channel_prefix, listen=False, on_resync=on_resync, **FAST)
        admin = await raw_client(private_redis.url)
        try:
            async with writer:
                await eventually(lambda: writer.publisher_connected, what="publisher up")
                resyncs_before = resyncs
                await admin.execute_command("CLIENT", "PAUSE", "10000", "WRITE")
                assert writer.send_many([wire.RdataCommand("s", "w", i, [i]) for i in range(1, n + 1)]) == n
                assert writer.pending == n
                await asyncio.sleep(0.1)  # written, held by Redis: no reply
                assert writer.stats.published == 0
                await admin.execute_command("CLIENT", "KILL", "ID", str(writer.publisher_client_id))
                await admin.execute_command("CLIENT", "UNPAUSE")
                await eventually(lambda: writer.stats.lost_in_flight == n, what="the batch counted as lost")
                assert writer.pending == 0 and writer.stats.published == 0
                await eventually(lambda: writer.stats.publisher_connects == 2, what="reconnect")
                await eventually(lambda: resyncs > resyncs_before, what="resync after the loss")
                assert writer.send(wire.PingCommand("after"))
                await writer.flush(5)
                assert writer.stats.published == 1
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")
            await admin.aclose()

    with caplog.at_level(logging.ERROR, logger="factstream.transport.redis"):
        run(scenario())
    assert f"connection lost with {n} commands unacknowledged" in caplog.text


def test_a_held_batch_is_acknowledged_promptly_and_idle_pings_still_answer(
    run: Any, private_redis: RedisServer, channel_prefix: str
) -> None:
    """The publisher waits for many replies at once (SO_RCVLOWAT) and then for any single one again.

    Redis holds a batch (CLIENT PAUSE WRITE) and lets it go: the flush ends
    as soon as the replies are in, and afterwards the idle PINGs (one reply
    each) and a lone command are answered well within ``ping_timeout``.
    """
    n = 3 * carrier_module.CHUNK

    async def scenario() -> None:
        writer = RedisCarrier(private_redis.url, channel_prefix, listen=False, **FAST)
        admin = await raw_client(private_redis.url)
        try:
            async with writer:
                await eventually(lambda: writer.publisher_connected, what="publisher up")
                await admin.execute_command("CLIENT", "PAUSE", "10000", "WRITE")
                assert writer.send_many([wire.RdataCommand("s", "w", i, [i]) for i in range(1, n + 1)]) == n
                await asyncio.sleep(0.1)
                await admin.execute_command("CLIENT", "UNPAUSE")
                await writer.flush(FAST["ping_timeout"] / 2)
                assert writer.stats.published == n
                await asyncio.sleep(4 * FAST["ping_interval"] + FAST["ping_timeout"])  # several idle PINGs
                assert writer.stats.health_check_failures == 0 and writer.stats.publisher_connects == 1
                assert writer.send(wire.PingCommand("lone"))
                await writer.flush(FAST["ping_timeout"] / 2)
                assert writer.stats.published == n + 1
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")
            await admin.aclose()

    run(scenario())


def test_send_many_past_the_bound_counts_every_refused_command_before_a_bad_one(
    run: Any, private_redis: RedisServer, channel_prefix: str
) -> None:
    private_redis.stop()  # nothing drains: the bound is reached by this call alone

    async def scenario() -> None:
        writer = RedisCarrier(private_redis.url, channel_prefix, max_pending=100, listen=False, **FAST)
        async with writer:
            cmds: list[wire.Command] = [wire.RdataCommand("s", "w", i, [i]) for i in range(1, 151)]
            cmds[129] = wire.RdataCommand("s", "", 130, [0])
            with pytest.raises(wire.ProtocolError, match="instance_name must be non-empty"):
                writer.send_many(cmds)
            assert writer.pending == 100  # the first hundred, queued
            assert writer.stats.dropped == 29 and writer.stats.overflows == 1  # 101..129, refused and counted
            assert writer.send_many(cmds[130:]) == 0 and writer.stats.dropped == 49

    run(scenario())


# ------------------------------------------------------------------ lifecycle: close is final


async def client_names(url: str, prefix: str) -> list[str]:
    """Names of the Redis connections whose CLIENT SETNAME starts with ``prefix`` (the server's own view)."""
    r = await raw_client(url)
    try:
        return sorted(c["name"] for c in await r.client_list() if c["name"].startswith(prefix))
    finally:
        await r.aclose()


async def wait_client_names(url: str, prefix: str, expected: list[str], timeout: float = 5.0) -> None:
    """Poll CLIENT LIST until the connections named ``prefix...`` are exactly ``expected`` (Redis drops a closed one soon, not at once)."""
    deadline = time.monotonic() + timeout
    while (names := await client_names(url, prefix)) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"Redis still lists {names}, expected {expected}, after {timeout}s")
        await asyncio.sleep(0.01)


async def assert_refuses_everything(carrier: RedisCarrier) -> None:
    """A closed carrier takes no command, waits for nothing and cannot start again; close() stays a no-op."""
    assert carrier.closed and carrier.pending == 0
    queued = carrier.stats.queued
    with pytest.raises(RuntimeError, match="is closed: cannot send"):
        carrier.send(wire.PingCommand("late"))
    with pytest.raises(RuntimeError, match="is closed: cannot send"):
        carrier.send_many([wire.PingCommand("late")])
    assert carrier.pending == 0 and carrier.stats.queued == queued
    async with asyncio.timeout(1):  # each answers at once, none waits for its own timeout
        with pytest.raises(RuntimeError, match="is closed: cannot flush"):
            await carrier.flush(30)
        with pytest.raises(RuntimeError, match="is closed: cannot wait for a subscription"):
            await carrier.wait_subscribed(30)
        with pytest.raises(RuntimeError, match="is closed: cannot start; make a new carrier"):
            await carrier.start()
        await carrier.close()
    assert carrier._tasks == []


def test_close_before_start_is_final(run: Any, redis_url: str, channel_prefix: str) -> None:
    """close() first, then start(): the carrier refuses to start instead of running with close() a no-op."""

    async def scenario() -> None:
        name = f"{channel_prefix}-early"
        carrier = RedisCarrier(redis_url, channel_prefix, client_name=name, **FAST)
        await carrier.close()
        await assert_refuses_everything(carrier)
        await asyncio.sleep(0.1)  # a loop started anyway would have connected by now
        assert await client_names(redis_url, name) == []

    run(scenario())


def test_close_stops_both_connections_and_refuses_what_follows(run: Any, redis_url: str, channel_prefix: str) -> None:
    """Both connections leave Redis' CLIENT LIST; afterwards nothing is accepted and dropped, nothing hangs."""

    async def scenario() -> None:
        name = f"{channel_prefix}-life"
        got: list[wire.Command] = []
        listener = RedisCarrier(redis_url, channel_prefix, on_command=got.append, **FAST)
        carrier = RedisCarrier(redis_url, channel_prefix, client_name=name, **FAST)
        async with listener:
            await listener.wait_subscribed(5)
            await carrier.start()
            await carrier.wait_subscribed(5)
            await eventually(lambda: carrier.publisher_connected, what="publisher up")
            await wait_client_names(redis_url, name, [f"{name}:pub", f"{name}:sub"])
            tasks = list(carrier._tasks)
            assert len(tasks) == 2
            carrier.send(wire.PingCommand("last"))
            await asyncio.gather(carrier.close(), carrier.close())  # the second waits for the same shutdown
            assert all(task.done() for task in tasks) and not carrier.subscribed
            await eventually(lambda: wire.PingCommand("last") in got, what="queued command published by close()")
            await wait_client_names(redis_url, name, [])
            await assert_refuses_everything(carrier)

    run(scenario())


def test_close_wakes_every_waiter_while_redis_is_unreachable(run: Any, channel_prefix: str) -> None:
    """Waiters get RuntimeError from close(), not a hang: flush() says how many commands were dropped."""

    async def scenario() -> None:
        carrier = RedisCarrier(f"redis://127.0.0.1:{free_port()}/0", channel_prefix, **FAST)  # nothing listens
        await carrier.start()
        carrier.send_many([wire.PingCommand(str(i)) for i in range(3)])
        subscribed = asyncio.create_task(carrier.wait_subscribed())
        flushed = asyncio.create_task(carrier.flush())
        await asyncio.sleep(0.1)
        assert not subscribed.done() and not flushed.done()
        async with asyncio.timeout(2):
            await carrier.close(flush_timeout=0.2)
            with pytest.raises(RuntimeError, match="closed with 3 commands unpublished"):
                await flushed
            with pytest.raises(RuntimeError, match="is closed"):
                await subscribed
        await assert_refuses_everything(carrier)

    run(scenario())
