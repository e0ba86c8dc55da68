"""The replication commands, one class per command, with Synapse's field names.

These classes are plain values shared by both codec twins: parsing a line with
the compiled or the pure-Python codec gives equal objects of the same class.
``to_line()`` gives the body of a line (everything after ``NAME ``) exactly as
Synapse writes it; :func:`factstream.wire.encode` adds the name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from . import _json
from .errors import ProtocolError

__all__ = [
    "Command",
    "ServerCommand",
    "RdataCommand",
    "PositionCommand",
    "ErrorCommand",
    "PingCommand",
    "NameCommand",
    "ReplicateCommand",
    "UserSyncCommand",
    "ClearUserSyncsCommand",
    "FederationAckCommand",
    "UserIpCommand",
    "RemoteServerUpCommand",
    "LockReleasedCommand",
    "NewActiveTaskCommand",
    "CancelTaskCommand",
    "COMMAND_MAP",
    "SERVER_COMMANDS",
    "CLIENT_COMMANDS",
]

_UNSET: Any = object()


def _word(value: object, what: str, cmd: str) -> str:
    """A space-delimited field: a non-empty str without spaces or newlines."""
    if not isinstance(value, str):
        raise ProtocolError(f"cannot encode {cmd}: {what} must be str, not {type(value).__name__}")
    if not value or " " in value or "\n" in value:
        raise ProtocolError(f"cannot encode {cmd}: {what} must be non-empty with no spaces or newlines", value)
    return value


def _text(value: object, what: str, cmd: str) -> str:
    """A trailing free-text field: a str without newlines (the line delimiter)."""
    if not isinstance(value, str):
        raise ProtocolError(f"cannot encode {cmd}: {what} must be str, not {type(value).__name__}")
    if "\n" in value:
        raise ProtocolError(f"cannot encode {cmd}: {what} must not contain a newline", value)
    return value


def _int(value: object, what: str, cmd: str) -> str:
    if type(value) is bool or not isinstance(value, int):
        raise ProtocolError(f"cannot encode {cmd}: {what} must be int, not {type(value).__name__}")
    if not -(2**63) <= value < 2**63:
        raise ProtocolError(f"cannot encode {cmd}: {what} {value} does not fit in 64 bits")
    return int.__repr__(value)


def _json_text(value: object, what: str, cmd: str) -> str:
    try:
        return _json.dumps(value)
    except (ValueError, TypeError, RecursionError) as err:
        raise ProtocolError(f"cannot encode {cmd}: {what} is not JSON Synapse can carry ({err})") from None


class Command:
    """Base of all commands: equality by value, readable repr."""

    __slots__ = ()
    NAME: ClassVar[str]
    _FIELDS: ClassVar[tuple[str, ...]]

    def to_line(self) -> str:
        """The line body (after ``NAME ``), as Synapse writes it."""
        raise NotImplementedError

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self._FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # rows may be lists

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._FIELDS)
        return f"{type(self).__name__}({args})"


class _SimpleCommand(Command):
    """A command whose body is one opaque string, kept as ``.data``."""

    __slots__ = ("data",)
    _FIELDS = ("data",)

    def __init__(self, data: str) -> None:
        self.data = data

    def to_line(self) -> str:
        return _text(self.data, "data", self.NAME)


class ServerCommand(_SimpleCommand):
    """``SERVER <server_name>``: the server's identity, sent first on a connection."""

    __slots__ = ()
    NAME = "SERVER"


class ErrorCommand(_SimpleCommand):
    """``ERROR <message>``: the sender saw an error and will usually close."""

    __slots__ = ()
    NAME = "ERROR"


class PingCommand(_SimpleCommand):
    """``PING <ms>``: keepalive; also switches on the peer's idle timeout."""

    __slots__ = ()
    NAME = "PING"


class NameCommand(_SimpleCommand):
    """``NAME <name>``: a client's human-friendly name."""

    __slots__ = ()
    NAME = "NAME"


class RemoteServerUpCommand(_SimpleCommand):
    """``REMOTE_SERVER_UP <server>``: a remote homeserver may be back online."""

    __slots__ = ()
    NAME = "REMOTE_SERVER_UP"


class NewActiveTaskCommand(_SimpleCommand):
    """``NEW_ACTIVE_TASK <task_id>``: a scheduled task was started somewhere."""

    __slots__ = ()
    NAME = "NEW_ACTIVE_TASK"


class CancelTaskCommand(_SimpleCommand):
    """``CANCEL_TASK <task_id>``: ask the instance running a task to cancel it."""

    __slots__ = ()
    NAME = "CANCEL_TASK"


class ClearUserSyncsCommand(_SimpleCommand):
    """``CLEAR_USER_SYNC <instance_id>``: forget every syncing user of an instance."""

    __slots__ = ()
    NAME = "CLEAR_USER_SYNC"
    _FIELDS = ("instance_id",)

    def __init__(self, instance_id: str) -> None:
        self.data = instance_id

    @property
    def instance_id(self) -> str:
        return self.data

    def to_line(self) -> str:
        return _text(self.data, "instance_id", self.NAME)


class ReplicateCommand(Command):
    """``REPLICATE``: ask every writer for its stream positions (body is empty)."""

    __slots__ = ()
    NAME = "REPLICATE"
    _FIELDS = ()

    def __init__(self) -> None:
        pass

    def to_line(self) -> str:
        return ""


class RdataCommand(Command):
    """``RDATA <stream_name> <instance_name> <token> <row_json>``: one row of a stream.

    ``token`` is ``None`` for the ``batch`` rows that precede the last row
    written at one token. ``row`` is the decoded JSON; the compiled codec
    decodes it lazily on first access and, until then, can re-encode the
    command from the received bytes when they are already canonical.
    """

    # The compiled codec fills these slots directly for a parsed line: _row is
    # unset, _raw holds the validated row JSON, _canonical says whether those
    # bytes are exactly Synapse's encoding, _loads builds the row from them.
    __slots__ = ("stream_name", "instance_name", "token", "_row", "_raw", "_canonical", "_loads")
    NAME = "RDATA"
    _FIELDS = ("stream_name", "instance_name", "token", "row")

    def __init__(self, stream_name: str, instance_name: str, token: int | None, row: Any) -> None:
        self.stream_name = stream_name
        self.instance_name = instance_name
        self.token = token
        self._row = row
        self._raw: bytes | None = None
        self._canonical = False
        self._loads: Callable[[bytes], Any] | None = None

    @property
    def row(self) -> Any:
        """The decoded row (a JSON value, usually a list)."""
        if self._row is _UNSET:
            assert self._raw is not None and self._loads is not None
            self._row = self._loads(self._raw)
        # Once handed out the row may be mutated, so stop trusting the bytes.
        self._raw = None
        return self._row

    @row.setter
    def row(self, value: Any) -> None:
        self._row = value
        self._raw = None

    @property
    def raw_row(self) -> bytes | None:
        """The received row bytes while they are canonical and untouched, else None."""
        return self._raw if self._canonical else None

    def to_line(self) -> str:
        name = self.NAME
        token = "batch" if self.token is None else _int(self.token, "token", name)
        raw = self._raw
        if raw is not None and self._canonical:
            body = raw.decode("ascii")
        else:
            body = _json_text(self.row, "row", name)
        return " ".join(
            (_word(self.stream_name, "stream_name", name), _word(self.instance_name, "instance_name", name), token, body)
        )


class PositionCommand(Command):
    """``POSITION <stream_name> <instance_name> <prev_token> <new_token>``.

    The writer's position moved from ``prev_token`` to ``new_token`` with no
    rows in between that the reader has not already been sent.
    """

    __slots__ = ("stream_name", "instance_name", "prev_token", "new_token")
    NAME = "POSITION"
    _FIELDS = ("stream_name", "instance_name", "prev_token", "new_token")

    def __init__(self, stream_name: str, instance_name: str, prev_token: int, new_token: int) -> None:
        self.stream_name = stream_name
        self.instance_name = instance_name
        self.prev_token = prev_token
        self.new_token = new_token

    def to_line(self) -> str:
        name = self.NAME
        return " ".join(
            (
                _word(self.stream_name, "stream_name", name),
                _word(self.instance_name, "instance_name", name),
                _int(self.prev_token, "prev_token", name),
                _int(self.new_token, "new_token", name),
            )
        )


class UserSyncCommand(Command):
    """``USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>``."""

    __slots__ = ("instance_id", "user_id", "device_id", "is_syncing", "last_sync_ms")
    NAME = "USER_SYNC"
    _FIELDS = ("instance_id", "user_id", "device_id", "is_syncing", "last_sync_ms")

    def __init__(
        self, instance_id: str, user_id: str, device_id: str | None, is_syncing: bool, last_sync_ms: int
    ) -> None:
        self.instance_id = instance_id
        self.user_id = user_id
        self.device_id = device_id
        self.is_syncing = is_syncing
        self.last_sync_ms = last_sync_ms

    def to_line(self) -> str:
        name = self.NAME
        device = "None" if self.device_id is None else _word(self.device_id, "device_id", name)
        return " ".join(
            (
                _word(self.instance_id, "instance_id", name),
                _word(self.user_id, "user_id", name),
                device,
                "start" if self.is_syncing else "end",
                _int(self.last_sync_ms, "last_sync_ms", name),
            )
        )


class FederationAckCommand(Command):
    """``FEDERATION_ACK <instance_name> <token>``: federation data up to token received."""

    __slots__ = ("instance_name", "token")
    NAME = "FEDERATION_ACK"
    _FIELDS = ("instance_name", "token")

    def __init__(self, instance_name: str, token: int) -> None:
        self.instance_name = instance_name
        self.token = token

    def to_line(self) -> str:
        name = self.NAME
        return f"{_word(self.instance_name, 'instance_name', name)} {_int(self.token, 'token', name)}"


class UserIpCommand(Command):
    """``USER_IP <user_id> [access_token, ip, user_agent, device_id, last_seen]``."""

    __slots__ = ("user_id", "access_token", "ip", "user_agent", "device_id", "last_seen")
    NAME = "USER_IP"
    _FIELDS = ("user_id", "access_token", "ip", "user_agent", "device_id", "last_seen")

    def __init__(
        self, user_id: str, access_token: str, ip: str, user_agent: str, device_id: str | None, last_seen: int
    ) -> None:
        self.user_id = user_id
        self.access_token = access_token
        self.ip = ip
        self.user_agent = user_agent
        self.device_id = device_id
        self.last_seen = last_seen

    def to_line(self) -> str:
        name = self.NAME
        body = _json_text(
            [self.access_token, self.ip, self.user_agent, self.device_id, self.last_seen], "fields", name
        )
        return f"{_word(self.user_id, 'user_id', name)} {body}"


class LockReleasedCommand(Command):
    """``LOCK_RELEASED [instance_name, lock_name, lock_key]``: a named lock was freed."""

    __slots__ = ("instance_name", "lock_name", "lock_key")
    NAME = "LOCK_RELEASED"
    _FIELDS = ("instance_name", "lock_name", "lock_key")

    def __init__(self, instance_name: str, lock_name: str, lock_key: str) -> None:
        self.instance_name = instance_name
        self.lock_name = lock_name
        self.lock_key = lock_key

    def to_line(self) -> str:
        return _json_text([self.instance_name, self.lock_name, self.lock_key], "fields", self.NAME)


COMMAND_MAP: dict[str, type[Command]] = {
    cls.NAME: cls
    for cls in (
        ServerCommand,
        RdataCommand,
        PositionCommand,
        ErrorCommand,
        PingCommand,
        NameCommand,
        ReplicateCommand,
        UserSyncCommand,
        ClearUserSyncsCommand,
        FederationAckCommand,
        UserIpCommand,
        RemoteServerUpCommand,
        LockReleasedCommand,
        NewActiveTaskCommand,
        CancelTaskCommand,
    )
}

# Which side of a TCP connection may send what (Synapse's lists). NEW_ACTIVE_TASK
# and CANCEL_TASK appear in neither: Synapse only carries them over Redis.
#: Commands the server (the writer end of a TCP connection) may send.
SERVER_COMMANDS: frozenset[str] = frozenset(
    {"SERVER", "RDATA", "POSITION", "ERROR", "PING", "REMOTE_SERVER_UP", "LOCK_RELEASED"}
)
#: Commands a client (the reader end of a TCP connection) may send.
CLIENT_COMMANDS: frozenset[str] = frozenset(
    {
        "NAME", "REPLICATE", "PING", "USER_SYNC", "CLEAR_USER_SYNC", "FEDERATION_ACK",
        "USER_IP", "ERROR", "REMOTE_SERVER_UP", "LOCK_RELEASED",
    }
)


def command_to_json(cmd: Command) -> dict[str, Any]:
    """A JSON-ready dict of ``cmd``: ``{"command": NAME, <field>: value, ...}``."""
    out: dict[str, Any] = {"command": cmd.NAME}
    for field in cmd._FIELDS:  # noqa: SLF001 - the field list is the public shape of a command
        out[field] = getattr(cmd, field)
    return out
