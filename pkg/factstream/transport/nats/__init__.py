"""Replication over NATS JetStream: a durable, replayable, clustered carrier.

Layout (one JetStream stream per deployment, see :class:`JetStreamLayout`):

* the stream ``FACTSTREAM_<server_name>`` holds the subjects
  ``factstream.<server_name>.log.<stream>.<writer>``, one per (stream, writer);
* each message is a page: wire lines exactly as the codec writes them (RDATA,
  ``batch`` rows, POSITION), newline-ended, whole facts of one (stream,
  writer), so every line tool reads it (:mod:`.pages`); its ``Nats-Msg-Id``
  names its first and last line, ``<stream>:<writer>:<token>:<row>..<token>:<row>``
  (JetStream drops a re-publish of the same page inside its duplicate window)
  and its ``Fs-Prev`` header is the token published on that subject before it
  (the chain a reader checks);
* other commands (USER_SYNC, FEDERATION_ACK, ...) go over plain NATS on
  ``factstream.<server_name>.ctl``, at most once, like Redis pub/sub.

Writer side: the hub's commands fill a page per (stream, writer), closed when
full (``page_rows``, ``page_bytes``) or when the publishing loop runs; pages
are published asynchronously, acknowledgements pipelined (up to
``max_in_flight`` unacknowledged). A fact counts as published once JetStream
acknowledged the page holding its last row (:meth:`NatsReplication.acked_positions`);
an unacknowledged publish is sent again (same message id) after ``ack_timeout``,
after a reconnect, or after an error reply. Before publishing a (stream, writer)
for the first time, and after anything was dropped, the writer reads the last
message JetStream holds for it and re-publishes the missing facts from the
stream's update source, so a writer killed mid-publish and restarted leaves
neither holes nor duplicates. An idle writer publishes ``POSITION p p`` every
``heartbeat`` seconds (same message id while nothing changes, so it is stored
once per duplicate window).

Reader side: each page is decoded by the codec in one call and its facts handed
to the hub in one run. One ephemeral push consumer per process over the deployment's log
subjects, ordered by hand: every delivery's stream and consumer sequence is
checked, a gap, a missing heartbeat or a reconnect recreates the consumer from
the sequence after the last delivered message, so a NATS restart never leaves a
reader stuck (matrix-org/dendrite#3177). A fresh process starts, per (stream,
writer), at the first message after the follower's position (binary search by
sequence, no database query). When the ``Fs-Prev`` chain shows that retention
no longer holds facts the reader needs (or a re-published message arrived out
of order), the follower catches up from the stream's table; that is logged and
counted (``fallbacks``, metric ``factstream_nats_fallbacks_total``).

:meth:`NatsReplication.key_stats` gives per (stream, writer) the JetStream sequence,
messages pending for this reader and the reader's lag (for ``factstream status``
and the metrics). The package: :mod:`.layout` (names, retention, counters), :mod:`.pages`
(what a message holds, its id), :mod:`.client` (connecting, the JetStream API, headers),
:mod:`.consumer` (ordered reads) and :mod:`.replication` (the hub glue); ``factstream tail
--nats`` prints a log (:mod:`.tail`), ``factstream status --nats`` reads its writers and
readers from JetStream (:mod:`.inspect`). See docs/nats.md.
"""

from __future__ import annotations

from .client import NatsUnavailable, StreamConfigError, check_nats, connect_nats, delete_stream
from .layout import MSG_ID, PREV, JetStreamLayout, KeyStats, NatsStats, Retention, subject_token
from .replication import NatsConnection, NatsReplication
from .tail import tail_nats

__all__ = [
    "JetStreamLayout",
    "Retention",
    "NatsReplication",
    "NatsConnection",
    "NatsStats",
    "KeyStats",
    "tail_nats",
    "connect_nats",
    "check_nats",
    "delete_stream",
    "NatsUnavailable",
    "StreamConfigError",
    "subject_token",
    "MSG_ID",
    "PREV",
]
