"""Exception types shared by every factstream module (and both codec twins)."""

from __future__ import annotations

__all__ = ["FactstreamError", "ProtocolError"]

_SHOW = 120  # how much of an offending line an error message quotes


class FactstreamError(Exception):
    """Base class of factstream's own errors."""


class ProtocolError(FactstreamError, ValueError):
    """A replication line (or command) that cannot be parsed or encoded.

    ``line`` holds the offending input (bytes or str) when there is one.
    ``commands`` holds commands a :class:`~factstream.wire.LineDecoder` had
    already completed in the same ``feed()`` call before the bad line, so a
    caller that catches the error loses nothing.
    """

    def __init__(self, reason: str, line: bytes | str | None = None) -> None:
        self.reason = reason
        self.line = line
        self.commands: list[object] = []
        if line is None:
            msg = reason
        else:
            shown = line[:_SHOW]
            more = "..." if len(line) > _SHOW else ""
            msg = f"{reason}: {shown!r}{more}"
        super().__init__(msg)

    def __reduce__(self) -> tuple[object, ...]:  # keep picklable across processes (Spark executors)
        return (_rebuild_protocol_error, (self.reason, self.line, self.commands))


def _rebuild_protocol_error(reason: str, line: bytes | str | None, commands: list[object]) -> ProtocolError:
    err = ProtocolError(reason, line)
    err.commands = commands
    return err
