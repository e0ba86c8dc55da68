"""One replication link over TCP: its states, its two ends, keepalive, validation and congestion.

:mod:`factstream.transport.tcp` listens and dials; this module is what runs on
each link (the protocol rules are in that module's doc).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Protocol

from .. import metrics, wire
from ..commands import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Command,
    ErrorCommand,
    NameCommand,
    PingCommand,
    RdataCommand,
    ServerCommand,
)
from ..errors import ProtocolError
from ..replication import _relay
from ..replication.carrier import CommandSink, Connection

__all__ = [
    "ConnState", "TcpConnection", "ServerConnection", "ClientConnection", "Codec", "Relay", "LogLimiter",
    "COMMANDS_PER_TURN", "READER_COMMANDS_PER_TURN",
]

log = logging.getLogger("factstream.transport.tcp")

DEFAULT_PING_INTERVAL = 5.0
DEFAULT_TIMEOUT = 15.0
DEFAULT_MAX_BUFFERED = 10_000
_ABORT_GRACE = 1.0  # seconds a closing connection may take to flush its ERROR

#: Most commands the writer's end of one link handles in one turn of the event loop. A client sending
#: faster (a flood of USER_SYNC on one connection: uvloop reads up to 32 x 256 KiB of it in one turn,
#: 200,000 commands held the loop 0.4 s) has the rest handled in the next turns, in order, while reading
#: from it is paused (TCP holds it back; nothing is buffered beyond the reads of one turn): other
#: links, timers and keepalives get the loop in between. About 10 ms of commands on a slow machine;
#: far more than a read of ordinary client traffic holds.
COMMANDS_PER_TURN = 2048
#: The same for a reader's end: RDATA from its writer costs a few times less than a client command
#: (a run goes to the follower in one call), so a writer's catch-up burst is split less often (at
#: 2048, the splitting cost a reader about 4% more CPU per row).
READER_COMMANDS_PER_TURN = 4 * COMMANDS_PER_TURN
#: A read of at most this many commands is handled without counting towards the turn (no bookkeeping
#: on the latency path): at most 32 such reads of one link in one turn (libuv's limit) is a bounded
#: amount too.
_SMALL_READ = 64


class ConnState(enum.IntEnum):
    """Where a link is in its life; ordered, so ``state >= CLOSING`` means going or gone."""

    NEW = 0  #: created; the transport has not arrived
    OPEN = 1  #: transport up, greeting sent; the peer has not introduced itself
    READY = 2  #: the peer introduced itself (NAME, or the expected SERVER)
    CLOSING = 3  #: close asked for; the transport is shutting down
    CLOSED = 4  #: connection_lost ran


# ``ConnState.CLOSING`` looked up through the enum's class costs more than the rest of a send; the hot paths
# compare with this alias.
_CLOSING = ConnState.CLOSING


class Codec(Protocol):
    """What a link needs of a wire codec (``factstream.wire`` or one of its twins)."""

    LineDecoder: Any

    def encode_lines(self, cmds: Sequence[Command]) -> bytes: ...


class Relay(Protocol):
    """What a link needs of a relay twin: per-name command counts for the metrics."""

    def tally(self, cmds: Sequence[Command]) -> dict[str, int]: ...


_IN = metrics.LabelledCounter(metrics.COMMANDS_IN)
_OUT = metrics.LabelledCounter(metrics.COMMANDS_OUT)


def _now_ms() -> str:
    return str(int(time.time() * 1000))


class LogLimiter:
    """At most ``burst`` log lines per ``window`` seconds for one kind of misbehaving peer.

    Each refused peer is worth a line naming it, but a client retrying in a
    loop (or hundreds of them) must not flood the writer's log: past the
    burst, lines are counted and one line at the end of the window says how
    many were not logged (the disconnect metrics count every one).
    """

    def __init__(self, logger: logging.Logger, what: str, *, burst: int = 10, window: float = 10.0) -> None:
        self.logger = logger
        self.what = what
        self.burst = burst
        self.window = window
        self.suppressed = 0  #: lines not logged in the current window
        self._start = -float("inf")
        self._count = 0
        self._summary: asyncio.TimerHandle | None = None
        self._summary_loop: asyncio.AbstractEventLoop | None = None

    def log(self, level: int, msg: str, *args: object) -> None:
        """Log ``msg % args`` unless this window's burst is spent (then count it)."""
        now = time.monotonic()
        if now - self._start >= self.window:
            self._start, self._count = now, 0
        if self._count < self.burst:
            self._count += 1
            self.logger.log(level, msg, *args)
            return
        self.suppressed += 1
        loop = asyncio.get_event_loop()
        if self._summary is None or self._summary_loop is not loop:  # (a loop closed with the count pending)
            if self._summary is not None:
                self._summary.cancel()
            self._summary_loop = loop
            self._summary = loop.call_later(max(0.0, self._start + self.window - now), self._report, level)

    def flush(self) -> None:
        """Log the count of lines not logged now (a listener stopping before the window ends)."""
        if self._summary is not None:
            self._summary.cancel()
            self._report(logging.WARNING)

    def _report(self, level: int) -> None:
        self._summary = None
        n, self.suppressed = self.suppressed, 0
        if n:
            self.logger.log(level, "%d more %s in the last %gs (not logged one by one)", n, self.what, self.window)


#: Peers refused for what they sent (bad lines, commands they may not send, TLS on one end only).
PEER_ERRORS = LogLimiter(log, "replication peers refused for what they sent")

#: The first bytes of a TLS record (handshake or alert, TLS 1.x) where a command line was expected.
_TLS_RECORD = (b"\x16\x03", b"\x15\x03")



class TcpConnection(asyncio.Protocol, Connection):
    """One TCP link; :class:`ServerConnection` and :class:`ClientConnection` are its two ends.

    Its life is one :class:`ConnState` at a time (NEW -> OPEN -> READY ->
    CLOSING -> CLOSED; CLOSING straight from NEW when closed before the
    transport arrived). Flow control (``_paused``) and keepalive
    (``_peer_pinged``) are separate axes and stay flags.
    """

    # send_queue in a slot: the relay's Broadcast reads it at its offset for every command it hands over.
    __slots__ = ("send_queue",)

    #: Set by the two ends: whether this is the writer's (server's) end.
    is_server: ClassVar[bool]
    #: Most commands of this link handled in one turn of the event loop (the rest wait for the next turns).
    commands_per_turn: ClassVar[int]
    #: Commands this end accepts from its peer, and may send to it.
    accepts: ClassVar[frozenset[str]]
    may_send: frozenset[str]

    def __init__(
        self,
        sink: CommandSink,
        *,
        local_name: str,
        expected_server_name: str | None = None,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        max_line_length: int = wire.DEFAULT_MAX_LINE_LENGTH,
        on_close: Any = None,
        on_made: Any = None,
        codec: Codec | None = None,
        relay: Relay | None = None,
    ) -> None:
        self.sink = sink
        self.local_name = local_name
        self.expected_server_name = expected_server_name
        self.ping_interval = ping_interval
        self.timeout = timeout
        self.max_buffered = max_buffered
        self._codec: Codec = codec or wire
        self._decoder = self._codec.LineDecoder(max_line_length=max_line_length)
        self._encode_lines = self._codec.encode_lines
        self._tally = (relay or _relay).tally
        # Runs of RDATA go to the sink in one call when it takes them (the hub does; readers only).
        self._rdata_sink = None if self.is_server else getattr(sink, "rdata_received", None)
        self._outq: list[Command] = []
        self._flush_scheduled = False
        #: ``_outq`` while sending is only appending to it (see ``Connection.send_queue``): set when a flush is
        #: scheduled, None again before ``_outq`` is taken or replaced, on pause and on close.
        self.send_queue: list[Command] | None = None
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._paused_at = 0.0  # when the socket last backed up (monotonic)
        self._pending: deque[Command] = deque()
        self.state = ConnState.NEW
        self._handshaken = False  # stays true after close: the reconnect backoff asks
        self._peer_pinged = False
        self._last_recv = self._last_sent = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._tick_due = 0.0  # when the running idle check was due (a later run means our loop stood still)
        self._close_reason = "closed"
        #: the last ERROR the peer sent (a writer says why it drops a reader before it does)
        self.peer_error: str | None = None
        self._on_close = on_close
        self._on_made = on_made
        self.closed: asyncio.Future[str] = asyncio.get_event_loop().create_future()
        self.description = "tcp"
        #: For ``TcpServer.connections_info`` (``factstream status``): peer address, when it connected (epoch
        #: seconds) and when it last sent PING (None: never).
        self.peer_address = ""
        self.connected_at: float | None = None
        self.last_ping_at: float | None = None
        # Commands received but left for a later turn of the loop (see commands_per_turn), in order,
        # from _held_at on, and the bad line that followed them (handled after them).
        self._held: list[Command] = []
        self._held_at = 0
        self._held_error: ProtocolError | None = None
        self._held_rdata = True  # every held command is RDATA (a reader catching up): the sink takes them in runs
        self._turn_used = 0  # commands handled this turn (reads of more than _SMALL_READ)
        self._turn_reset = False  # a reset of _turn_used is scheduled for the next turn
        self._reading_paused = False

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        if self.state is not ConnState.NEW:
            # Closed before the transport arrived (a server stopping while a peer
            # was connecting): never set it up, or it would outlive the server.
            transport.abort()  # type: ignore[attr-defined]
            return
        peer = transport.get_extra_info("peername")
        self.peer_address = f"{peer[0]}:{peer[1]}" if peer else ""
        self.connected_at = time.time()
        side = "from" if self.is_server else "to"
        self.description = f"tcp {side} {peer[0]}:{peer[1]}" if peer else "tcp"
        self.state = ConnState.OPEN
        self._write([self._greeting(), PingCommand(_now_ms())])
        self._schedule()
        if self._on_made is not None:
            self._on_made(self)
        self.sink.connection_made(self)

    def data_received(self, data: bytes) -> None:
        if self.state >= _CLOSING:
            return
        self._last_recv = time.monotonic()
        if self.state is ConnState.OPEN and data[:2] in _TLS_RECORD and self.is_server:
            # A reader configured for TLS against a plaintext listener: say so, not "line is not valid UTF-8".
            PEER_ERRORS.log(logging.WARNING, "%s: the client started a TLS handshake, but this listener is "
                            "plaintext (give the writer --tls-cert, or connect without TLS); closing", self.description)
            self._abort_with("protocol", "this listener does not speak TLS")
            return
        if self._held_error is not None:
            return  # a bad line is waiting its turn: the link closes after the commands before it
        error: ProtocolError | None = None
        try:
            cmds = self._decoder.feed(data)
        except ProtocolError as err:
            cmds = err.commands
            error = err
        if cmds:
            counts = self._tally(cmds)
            _IN.inc_all(counts)
            n = len(cmds)
            rdata_sink = self._rdata_sink
            only_rdata = rdata_sink is not None and counts.get("RDATA") == n
            if n > _SMALL_READ or self._held:
                if self._held or self._turn_used + n > self.commands_per_turn:
                    self._hold(cmds, error, only_rdata)  # too many for this turn: the rest in the next ones
                    return
                self._count_turn(n)
            if only_rdata:
                try:
                    rdata_sink(self, cmds)  # type: ignore[misc]  # the hot path: a read of nothing but RDATA
                except Exception:  # a bug behind the sink must not take the process down
                    self._failed()
                    return
            elif not self._dispatch(cmds):
                return
        if error is not None and self.state < _CLOSING:
            if self._held:  # (a read that begins with the bad line) after the commands held before it
                self._held_error = error
            else:
                self._bad_line(error)

    def _dispatch(self, cmds: Sequence[Command]) -> bool:
        """Handle ``cmds`` in order (runs of RDATA to the sink in one call); False if the link closed meanwhile."""
        rdata_sink = self._rdata_sink
        try:
            i, n = 0, len(cmds)
            while i < n:
                if self.state >= _CLOSING:
                    return False
                if rdata_sink is not None and type(cmds[i]) is RdataCommand:
                    j = i + 1
                    while j < n and type(cmds[j]) is RdataCommand:
                        j += 1
                    rdata_sink(self, cmds[i:j])
                    i = j
                else:
                    self._handle(cmds[i])
                    i += 1
        except Exception:  # a bug behind the sink must not take the process down
            self._failed()
            return False
        return self.state < _CLOSING

    def _failed(self) -> None:
        log.exception("%s: handling a received command failed; closing the connection", self.description)
        self._abort_with("error", "internal error while handling a command")

    def _bad_line(self, error: ProtocolError) -> None:
        PEER_ERRORS.log(logging.WARNING, "%s: bad line, closing: %s", self.who, error)
        self._abort_with("protocol", f"invalid line: {error}")

    # -- a peer sending more than one turn of the loop's worth (see commands_per_turn)

    def _count_turn(self, n: int) -> None:
        self._turn_used += n
        if not self._turn_reset:
            self._turn_reset = True
            asyncio.get_event_loop().call_soon(self._new_turn)

    def _new_turn(self) -> None:
        self._turn_reset = False
        if not self._held:  # while commands are held, _next_held keeps the count (it may run after this, same turn)
            self._turn_used = 0

    def _hold(self, cmds: Sequence[Command], error: ProtocolError | None, only_rdata: bool) -> None:
        """Leave ``cmds`` (and then ``error``) for :meth:`_next_held`, in order; pause reading from the peer.

        What waits is at most the reads of one turn: until it is handled,
        the peer's socket (then TCP) holds back the rest of a flood.
        """
        if not self._held:
            asyncio.get_event_loop().call_soon(self._next_held)
            self._held_rdata = only_rdata
        else:
            self._held_rdata = self._held_rdata and only_rdata
        self._held.extend(cmds)
        self._held_error = error
        self._pause_reading()

    def _next_held(self) -> None:
        """This turn's share of the held commands; then again next turn, or reading again once none are left.

        The share is what the turn has left: on uvloop this runs in the
        same turn as the reads before it (on asyncio in the next one).
        """
        if self.state >= _CLOSING:
            self._drop_held()
            return
        room = self.commands_per_turn - self._turn_used
        self._turn_used = 0  # accounted for: reading is paused, so the next run is a turn of its own
        loop = asyncio.get_event_loop()
        if room <= 0:
            loop.call_soon(self._next_held)
            return
        self._last_recv = time.monotonic()  # the peer's commands are still being handled: not silence
        held, at = self._held, self._held_at
        end = at + room
        if end < len(held):
            self._held_at = end
            chunk = held[at:end]
        else:
            chunk = held[at:] if at else held
            self._held, self._held_at = [], 0
        if self._held_rdata:
            try:
                self._rdata_sink(self, chunk)  # type: ignore[misc]  # the hot path (set only with a sink)
            except Exception:  # a bug behind the sink must not take the process down
                self._failed()
            if self.state >= _CLOSING:
                self._drop_held()
                return
        elif not self._dispatch(chunk):
            self._drop_held()
            return
        if self._held:
            loop.call_soon(self._next_held)
            return
        error, self._held_error = self._held_error, None
        if error is not None:
            self._bad_line(error)
            return
        self._count_turn(len(chunk))  # what the next reads of this turn may still add
        self._resume_reading()

    def _drop_held(self) -> None:
        self._held, self._held_at, self._held_error = [], 0, None

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused:
            self._reading_paused = False
            if self._transport is not None and not self._transport.is_closing():
                self._transport.resume_reading()

    def eof_received(self) -> bool | None:
        self._close_reason = "eof"
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._held:
            # The link went down with commands received and not yet handled (the peer reset it): handled
            # now, as when every command of a read was handled at once; dropped if this end was closing.
            held, at = self._held, self._held_at
            self._drop_held()
            self._dispatch(held[at:])
        was_up = self.connected_at is not None and self.state is not ConnState.CLOSED
        self.state = ConnState.CLOSED
        self.send_queue = None
        if self._pending:
            metrics.PENDING_OUT.dec(len(self._pending))
            self._pending.clear()
        reason = self._close_reason if exc is None or self._close_reason != "closed" else f"error: {exc}"
        if was_up:  # one that never came up (a failed TLS handshake) is counted where it failed
            metrics.DISCONNECTS.labels(reason.split(":")[0]).inc()
            self.sink.connection_lost(self, reason)
        if not self.closed.done():
            self.closed.set_result(reason)
        if self._on_close is not None:
            self._on_close(self)

    def pause_writing(self) -> None:
        self._paused = True
        self._paused_at = time.monotonic()
        self.send_queue = None

    def resume_writing(self) -> None:
        self._paused = False
        if self._pending and self.state < _CLOSING:
            cmds = list(self._pending)
            cmds.extend(self._outq)
            self.send_queue = None
            self._outq = []
            metrics.PENDING_OUT.dec(len(cmds))
            self._pending.clear()
            self._write(cmds)

    # ------------------------------------------------------------ Connection

    def send(self, cmd: Command) -> None:
        self.send_many((cmd,))

    def send_many(self, cmds: Iterable[Command]) -> None:
        if self.state >= _CLOSING:
            return
        if not self._paused:
            # Coalesce everything sent in one loop iteration into one write (one syscall).
            self._outq.extend(cmds)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_event_loop().call_soon(self._flush)
                self.send_queue = self._outq
            return
        self._buffer(cmds)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.send_queue = None
        if self.state >= _CLOSING or not self._outq:
            self._outq = []
            return
        cmds, self._outq = self._outq, []
        if self._paused:
            self._buffer(cmds)
        else:
            self._write(cmds)

    def _buffer(self, cmds: Iterable[Command]) -> None:
        """The socket is backed up: hold at most ``max_buffered`` commands, then drop the peer."""
        before = len(self._pending)
        self._pending.extend(cmds)
        metrics.PENDING_OUT.inc(len(self._pending) - before)
        if len(self._pending) > self.max_buffered:
            log.error(
                "%s fell behind: more than %d commands buffered; disconnecting it "
                "(it will reconnect and catch up)", self.who, self.max_buffered,
            )
            self._abort_with("congestion", f"client fell behind: more than {self.max_buffered} commands buffered")

    def close(self, reason: str | None = None) -> None:
        if self.state >= _CLOSING:
            return
        if reason:
            self._abort_with("closed", reason)
        else:
            self._close_reason = "closed"
            self._shutdown()

    @property
    def connected(self) -> bool:
        return self.state < _CLOSING and self._transport is not None

    @property
    def handshake_done(self) -> bool:
        """Whether the peer introduced itself (and, to a reader, as the expected server); stays true after close."""
        return self._handshaken

    @property
    def who(self) -> str:
        """The link and the peer's name, for the log: ``tcp from 10.0.0.5:4242 (reader1)``."""
        return f"{self.description} ({self.peer_name})" if self.peer_name else self.description

    @property
    def buffered(self) -> int:
        """Commands waiting because the socket is backed up."""
        return len(self._pending)

    # ------------------------------------------------------------ internals

    def _write(self, cmds: Iterable[Command]) -> None:
        cmds = list(cmds) if not isinstance(cmds, (list, tuple)) else cmds
        if not cmds or self._transport is None or self._transport.is_closing():
            return  # (uvloop raises on a write to a closed transport; a connect cancelled at its end closes it)
        try:
            data = self._encode_lines(cmds)
        except ProtocolError:
            log.exception("%s: cannot encode outgoing commands; dropping them", self.description)
            return
        self._transport.write(data)
        self._last_sent = time.monotonic()
        _OUT.inc_all(self._tally(cmds))

    def _handle(self, cmd: Command) -> None:
        name = cmd.NAME
        if name == "RDATA" and not self.is_server:  # the hot path
            self.sink.command_received(self, cmd)
            return
        if name not in self.accepts:
            side = "client" if self.is_server else "server"
            PEER_ERRORS.log(logging.WARNING, "%s sent %s, which a %s may not send; closing",
                            self.who, name, side)
            self._abort_with("direction", f"{name} is not a command a {side} may send")
            return
        if name == "PING":
            self._peer_pinged = True
            self.last_ping_at = time.time()
            return
        if name == "SERVER":
            server_name = cmd.data  # type: ignore[attr-defined]
            self.peer_name = server_name
            if self.expected_server_name is not None and server_name != self.expected_server_name:
                log.error("%s: expected server %r but it says it is %r", self.description, self.expected_server_name, server_name)
                self._abort_with("server_name", f"wrong server name: expected {self.expected_server_name!r}, got {server_name!r}")
                return
            self._ready()
            return
        if name == "NAME":
            self.peer_name = cmd.data  # type: ignore[attr-defined]
            self._ready()
            return
        if name == "ERROR":
            self.peer_error = cmd.data  # type: ignore[attr-defined]
            log.warning("%s reported an error: %s", self.who, cmd.data)  # type: ignore[attr-defined]
            return
        self.sink.command_received(self, cmd)

    def _abort_with(self, reason: str, message: str) -> None:
        """Send ERROR <message> (bypassing the congestion buffer) and close."""
        if self.state >= _CLOSING:
            return
        self._close_reason = reason
        if self._transport is not None:
            try:
                self._transport.write(self._encode_lines([ErrorCommand(message.replace("\n", " ").replace("\r", " "))]))
                _OUT.inc("ERROR")
            except Exception:  # the ERROR is a courtesy
                pass
        self._shutdown()

    def _shutdown(self) -> None:
        self.send_queue = None
        if self.state < _CLOSING:
            self.state = ConnState.CLOSING
        if self._pending:
            metrics.PENDING_OUT.dec(len(self._pending))
            self._pending.clear()
        transport = self._transport
        if transport is None:
            return
        transport.close()
        # A peer that does not read would keep the socket open forever: abort after a grace period.
        asyncio.get_event_loop().call_later(_ABORT_GRACE, self._abort_transport, transport)

    def _abort_transport(self, transport: asyncio.BaseTransport) -> None:
        # Only if still open: asyncio's selector transport, once it has flushed and closed by itself, fails
        # on abort() inside the loop ("Exception in callback _SelectorTransport.abort()": a traceback in
        # the writer's log for every dropped reader that read what was left within the grace period).
        if self.state is not ConnState.CLOSED:
            transport.abort()  # type: ignore[attr-defined]

    def _ready(self) -> None:
        self._handshaken = True
        if self.state is ConnState.OPEN:
            self.state = ConnState.READY

    def _greeting(self) -> Command:
        raise NotImplementedError

    def _schedule(self) -> None:
        interval = max(0.01, min(self.ping_interval, self.timeout) / 3)
        self._tick_due = time.monotonic() + interval
        self._timer = asyncio.get_event_loop().call_later(interval, self._tick)

    def _tick(self) -> None:
        if self.state >= _CLOSING:
            return
        now = time.monotonic()
        stalled = now - self._tick_due
        if stalled > max(0.01, min(self.ping_interval, self.timeout) / 3):
            # Our own loop stood still (a long synchronous call, a paused process): we could not read, and
            # what the peer sent meanwhile waits in the socket. The stall is not the peer's silence.
            self._last_recv = min(now, self._last_recv + stalled)
            self._paused_at = min(now, self._paused_at + stalled)
        if self._peer_pinged and now - self._last_recv > self.timeout:
            log.warning("%s: nothing received for %.1fs, closing", self.who, now - self._last_recv)
            self._abort_with("timeout", f"no command received for {self.timeout:g}s")
            return
        if self._paused and now - self._paused_at > self.timeout:
            # The peer reads nothing we send (or its host is gone): without this, one that never PINGs and
            # never reads would hold what is queued for it (the socket's, the transport's) forever.
            log.error("%s has read nothing for %.1fs (its socket stays backed up, %d bytes waiting); "
                      "disconnecting it", self.who, now - self._paused_at,
                      self._transport.get_write_buffer_size() if self._transport is not None else 0)
            self._abort_with("congestion", f"not reading: the socket stayed backed up for {self.timeout:g}s")
            return
        if now - self._last_sent >= self.ping_interval:
            self.send(PingCommand(_now_ms()))
            self._last_sent = now
        self._schedule()


# ====================================================================== server


class ServerConnection(TcpConnection):
    """The writer's end of one link: greets with SERVER, takes only what a client may send."""

    is_server = True
    accepts = CLIENT_COMMANDS
    may_send = SERVER_COMMANDS
    commands_per_turn = COMMANDS_PER_TURN

    def _greeting(self) -> Command:
        return ServerCommand(self.local_name)


class ClientConnection(TcpConnection):
    """A reader's end of one link: greets with NAME, checks the server's name, takes what a server may send."""

    is_server = False
    accepts = SERVER_COMMANDS
    may_send = CLIENT_COMMANDS
    commands_per_turn = READER_COMMANDS_PER_TURN

    def _greeting(self) -> Command:
        return NameCommand(self.local_name)

