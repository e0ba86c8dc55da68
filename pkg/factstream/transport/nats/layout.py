"""How a deployment lies on JetStream: stream and subject names, retention, and the counters.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..._checks import seconds, whole

logger = logging.getLogger("factstream.transport.nats")

#: JetStream's de-duplication header.
MSG_ID = "Nats-Msg-Id"
#: The token published on the same subject before this message ("" when none).
PREV = "Fs-Prev"

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_NS = 1_000_000_000


def subject_token(name: str) -> str:
    """``name`` as one NATS subject token: letters, digits, ``_`` and ``-`` kept, other bytes ``%XX``."""
    if name and all(c in _SAFE for c in name):
        return name
    return "".join(chr(b) if chr(b) in _SAFE else f"%{b:02X}" for b in name.encode("utf-8")) or "%00"


@dataclass(frozen=True)
class JetStreamLayout:
    """Names of one deployment's JetStream stream and subjects."""

    deployment: str
    stream: str
    prefix: str

    @classmethod
    def for_server(cls, server_name: str, *, stream: str | None = None, prefix: str | None = None) -> JetStreamLayout:
        """The layout of deployment ``server_name`` (``stream`` / ``prefix`` override the defaults)."""
        if not server_name or any(c in server_name for c in " \r\n\t"):
            raise ValueError(f"server name {server_name!r} must be non-empty without spaces or line breaks")
        token = subject_token(server_name)
        name = stream or "FACTSTREAM_" + token.replace("%", "_")
        if any(c in name for c in ". *>/\\") or not name:
            raise ValueError(f"JetStream stream name {name!r} may not contain '.', ' ', '*', '>', '/' or '\\'")
        return cls(server_name, name, prefix or f"factstream.{token}")

    def log_subject(self, stream: str, writer: str) -> str:
        """The subject of ``writer``'s facts of ``stream``."""
        return f"{self.prefix}.log.{subject_token(stream)}.{subject_token(writer)}"

    @property
    def log_subjects(self) -> str:
        """The wildcard of every log subject (the JetStream stream's subjects)."""
        return f"{self.prefix}.log.>"

    @property
    def control_subject(self) -> str:
        """Plain NATS subject of the commands that are not facts (USER_SYNC, ...)."""
        return f"{self.prefix}.ctl"


@dataclass(frozen=True)
class Retention:
    """How the deployment's JetStream stream keeps facts (used only when creating it).

    ``max_age`` is the replay window in seconds (0: unlimited); ``max_bytes`` /
    ``max_msgs`` bound the whole stream (-1: unlimited); ``replicas`` is the
    number of copies in a cluster (1 on a single server, 3 for a cluster that
    survives one node); ``duplicate_window`` (seconds) is how long message ids
    are remembered (0: JetStream's default, 2 minutes or ``max_age`` if
    shorter), never longer than a non-zero ``max_age`` (JetStream refuses
    that); ``storage`` is ``file`` (survives restarts) or ``memory``.
    Options JetStream would refuse raise ValueError/TypeError here, not
    when the stream is created.
    """

    replicas: int = 1
    max_age: float = 7 * 24 * 3600.0
    max_bytes: int = -1
    max_msgs: int = -1
    duplicate_window: float = 120.0
    storage: str = "file"

    def __post_init__(self) -> None:
        if self.storage not in ("file", "memory"):
            raise ValueError(f"storage must be 'file' or 'memory', not {self.storage!r}")
        whole("replicas", self.replicas, 1, 5)
        whole("max_bytes", self.max_bytes, -1)
        whole("max_msgs", self.max_msgs, -1)
        max_age = int(seconds("max_age", self.max_age, zero=True) * _NS)  # as JetStream compares them, in ns
        window = int(seconds("duplicate_window", self.duplicate_window, zero=True) * _NS)
        if max_age and window > max_age:
            raise ValueError(
                f"duplicate_window ({self.duplicate_window:g} s) must not be longer than max_age ({self.max_age:g} s): "
                "JetStream refuses such a stream; pass a duplicate_window of at most max_age, or a longer max_age"
            )

    def stream_config(self, layout: JetStreamLayout) -> dict[str, Any]:
        """The JetStream ``StreamConfig`` for ``layout``."""
        return {
            "name": layout.stream,
            "subjects": [layout.log_subjects],
            "retention": "limits",
            "storage": self.storage,
            "num_replicas": self.replicas,
            "max_age": int(self.max_age * _NS),
            "max_bytes": self.max_bytes,
            "max_msgs": self.max_msgs,
            "max_msgs_per_subject": -1,
            "discard": "old",
            "duplicate_window": int(self.duplicate_window * _NS),
        }


@dataclass
class NatsStats:
    """Counters of one :class:`NatsReplication` (plain integers)."""

    queued: int = 0  #: log messages (pages) accepted for publishing
    rows_queued: int = 0  #: wire lines in those pages
    acked: int = 0  #: publishes JetStream acknowledged (stored or recognised as duplicates)
    duplicates: int = 0  #: acknowledgements saying "duplicate" (a re-publish JetStream already had)
    retried: int = 0  #: publishes sent again (timeout, reconnect, error reply)
    publish_errors: int = 0  #: error replies from JetStream (each retried)
    dropped: int = 0  #: log messages discarded from the queue (overflow; repaired from the source)
    too_large: int = 0  #: rows larger than a message may be (logged, not published; readers catch up)
    repaired_rows: int = 0  #: rows re-published from the update source after a gap in JetStream
    repairs: int = 0  #: repairs run (first publish of a (stream, writer), after drops)
    control_sent: int = 0  #: non-log commands published on the control subject
    received: int = 0  #: log messages (pages) delivered to this reader
    rows_received: int = 0  #: valid wire lines in them
    control_received: int = 0  #: control commands received
    invalid: int = 0  #: messages that are not valid replication lines (logged, skipped)
    skipped: int = 0  #: replayed messages below this reader's position (not handed to the hub)
    echoes: int = 0  #: own log messages skipped by a reader that also writes
    fallbacks: int = 0  #: times the reader fell back to the table's catch-up (gap in the log)
    broken_batches: int = 0  #: batches whose rows were not all in the log (fetched from the table)
    consumers_created: int = 0  #: JetStream consumers created (first one included)
    consumer_resets: int = 0  #: consumers recreated (gap, silence, reconnect)
    lookups: int = 0  #: JetStream message lookups (resume positions, repair points)
    connects: int = 0  #: NATS connections made (first one included)
    disconnects: int = 0  #: NATS disconnections seen

    def as_dict(self) -> dict[str, int]:
        """The counters as a dict."""
        return asdict(self)


@dataclass
class KeyStats:
    """Where one (stream, writer) stands on one side of the carrier.

    Writer side: ``sequence`` is the JetStream sequence of its last
    acknowledged message, ``position`` the token published (acknowledged) so
    far, ``pending`` the messages not acknowledged yet. Reader side:
    ``sequence`` is the last delivered message's sequence, ``position`` the
    token delivered, ``pending`` the messages of this (stream, writer)
    JetStream still holds for this reader (as of the last
    ``NatsReplication.refresh_pending``; 0 when the consumer has nothing
    pending at all) and ``lag_seconds`` the
    age of the last delivered message when it arrived.
    """

    side: str
    stream: str
    writer: str
    sequence: int = 0
    position: int | None = None
    pending: int = 0
    lag_seconds: float | None = None
    fallbacks: int = 0


class _RateLimitedLog:
    """Log at most one line per ``interval`` seconds, counting what it held back."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._next = 0.0
        self._held = 0

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            return
        if self._held:
            msg += " (%d similar messages suppressed)"
            args = (*args, self._held)
        self._held = 0
        self._next = now + self.interval
        logger.warning(msg, *args)
