"""Replication over Redis pub/sub: the carrier.

Synapse's Redis layout: every process (writers and readers alike) holds two
connections to Redis, one subscribed and one publishing. Each command is one
pub/sub message holding one line without its newline, published on the
channel named after the deployment (``<server_name>``), except USER_IP, which
goes to ``<server_name>/USER_IP`` (subscribing to that one is opt-in).

The carrier turns messages into commands and commands into messages, nothing
more: it never looks at positions. What it adds around that:

* both connections reconnect forever, independently, with capped exponential
  backoff and jitter; a silent dead connection is found by PING health checks;
* ``on_subscribed`` fires every time the subscription is confirmed by Redis
  (the owner publishes REPLICATE and its positions from there, so no answer
  can arrive before anyone listens);
* outbound commands are packed into PUBLISH requests when sent and go into a
  bounded queue that is flushed with pipelining: everything queued in one
  event-loop tick goes out in one write, in order (``send_many`` writes full
  chunks at once when nothing older waits); a command counts as published
  when Redis acknowledged it. Past the bound, new commands are refused and counted, loudly;
  ``on_resync`` then fires once the queue has drained, and after every
  publisher reconnect, so the owner can announce its positions and let
  readers repair the gap from the database (pub/sub is at-most-once);
* an instance's own RDATA / POSITION / LOCK_RELEASED echoes are dropped by
  instance name;
* invalid messages are logged (rate-limited) and counted, never raised.

The transport is redis-py's asyncio ``Connection`` with the hiredis parser,
used directly (no pool, no client object) so reconnects, health checks and
pipelining are under this module's control.

:class:`RedisReplication` plugs the carrier into a
:class:`~factstream.replication.ReplicationHub` (REPLICATE after every
confirmed subscription, positions announced after every reconnect, RDATA
held back on a fresh subscription until its writer's POSITION);
the package splits into :mod:`.urls` (URLs and channel names),
:mod:`.carrier` (the two connections), :mod:`.fastpaths` (the three
places it reaches under redis-py's API, each with a fallback) and
:mod:`.replication` (the hub glue); ``factstream tail --redis`` (``factstream.cli.tail_redis``) prints a
live deployment's traffic. See docs/redis.md.
"""

from __future__ import annotations

from ...backoff import backoff_delay
from ...commands import command_to_json
from ...redaction import redact_url as redacted_url
from .carrier import ECHO_COMMANDS, RedisCarrier, RedisCarrierStats
from .fastpaths import _buffered_replies
from .replication import RedisConnection, RedisReplication
from .urls import USER_IP_CHANNEL, RedisChannels, connection_kwargs_from_url

__all__ = [
    "RedisCarrier",
    "RedisReplication",
    "RedisConnection",
    "RedisCarrierStats",
    "RedisChannels",
    "backoff_delay",
    "connection_kwargs_from_url",
    "redacted_url",
    "command_to_json",
    "USER_IP_CHANNEL",
    "ECHO_COMMANDS",
    "_buffered_replies",
]
