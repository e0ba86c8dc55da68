"""Errors raised by stream id generators and readers."""

from __future__ import annotations

from ..errors import FactstreamError

__all__ = ["IdGeneratorError", "SequenceBehindError", "PositionWaitTimeout"]


class IdGeneratorError(FactstreamError):
    """A generator was configured or used in a way that cannot give correct ids."""


class SequenceBehindError(IdGeneratorError):
    """A PostgreSQL sequence is behind ``stream_positions``: ids may already have been used.

    Startup stops rather than risk handing out an id twice; the message names
    the ``setval`` to run once the cause (e.g. a partial restore) is understood.
    """


class PositionWaitTimeout(FactstreamError, TimeoutError):
    """``wait_for`` gave up: the writer did not reach the position in time.

    ``stream_name``, ``instance_name``, ``wanted`` and ``reached`` say how far
    it got, so the caller can report it rather than proceed silently.
    """

    def __init__(self, stream_name: str, instance_name: str | None, wanted: int, reached: int, timeout: float) -> None:
        self.stream_name = stream_name
        self.instance_name = instance_name
        self.wanted = wanted
        self.reached = reached
        self.timeout = timeout
        who = f"writer {instance_name!r}" if instance_name is not None else "the linear position"
        super().__init__(
            f"stream {stream_name!r}: {who} reached {reached}, not {wanted}, within {timeout:g}s; "
            "the writer may be down or replication may be lagging (check that it is connected)"
        )

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (self.stream_name, self.instance_name, self.wanted, self.reached, self.timeout))
