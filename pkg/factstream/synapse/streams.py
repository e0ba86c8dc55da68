"""Synapse's id-generated streams: their tables, sequence and writers, as Synapse 1.163 builds them.

Every stream whose ids come from a PostgreSQL sequence and whose writers
record positions in ``stream_positions`` is listed here, with the same
table/column triples Synapse passes to its multi-writer id generator. The
list was read off Synapse's storage code; ``tests/test_synapse_streams_oracle.py``
re-reads that code from the installed oracle and fails when Synapse gains a
stream this list lacks (or changes one).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StreamTable", "SynapseIdStream", "SYNAPSE_ID_STREAMS", "SYNAPSE_VERSION", "by_name"]

#: The Synapse release this list was taken from.
SYNAPSE_VERSION = "1.163"


@dataclass(frozen=True, slots=True)
class StreamTable:
    """One table carrying a stream's rows: which column holds the id and which the writer."""

    table: str
    instance_column: str
    id_column: str


@dataclass(frozen=True, slots=True)
class SynapseIdStream:
    """One stream of Synapse's database, as its id generator sees it.

    ``name`` is the key in ``stream_positions`` (not always the wire name:
    ``wire`` is the replication stream that carries it, if any).
    ``writers_setting`` names the ``stream_writers`` entry of homeserver.yaml
    that lists its writers; ``fixed_writers`` holds the writers Synapse
    hard-codes instead (an empty tuple with no setting: any process writes
    and no position is ever recorded). ``positive`` is False for backfill,
    whose ids count down (-1, -2, ...) from the same kind of sequence.
    """

    name: str
    sequence: str
    tables: tuple[StreamTable, ...]
    wire: str | None
    writers_setting: str | None = None
    fixed_writers: tuple[str, ...] = ()
    positive: bool = True

    @property
    def records_positions(self) -> bool:
        """Whether Synapse keeps this stream's writer positions in ``stream_positions``."""
        return bool(self.writers_setting or self.fixed_writers)


def _t(*triples: tuple[str, str, str]) -> tuple[StreamTable, ...]:
    return tuple(StreamTable(*t) for t in triples)


SYNAPSE_ID_STREAMS: tuple[SynapseIdStream, ...] = (
    SynapseIdStream(
        "account_data", "account_data_sequence",
        _t(("room_account_data", "instance_name", "stream_id"),
           ("room_tags_revisions", "instance_name", "stream_id"),
           ("account_data", "instance_name", "stream_id")),
        wire="account_data", writers_setting="account_data"),
    SynapseIdStream(
        "caches", "cache_invalidation_stream_seq",
        _t(("cache_invalidation_stream_by_instance", "instance_name", "stream_id")),
        wire="caches"),
    SynapseIdStream(
        "to_device", "device_inbox_sequence",
        _t(("device_inbox", "instance_name", "stream_id"),
           ("device_federation_outbox", "instance_name", "stream_id")),
        wire="to_device", writers_setting="to_device"),
    SynapseIdStream(
        "device_lists_stream", "device_lists_sequence",
        _t(("device_lists_stream", "instance_name", "stream_id"),
           ("user_signature_stream", "instance_name", "stream_id"),
           ("device_lists_outbound_pokes", "instance_name", "stream_id"),
           ("device_lists_changes_in_room", "instance_name", "stream_id"),
           ("device_lists_remote_pending", "instance_name", "stream_id"),
           ("device_lists_changes_converted_stream_position", "instance_name", "stream_id")),
        wire="device_lists", writers_setting="device_lists"),
    SynapseIdStream(
        "e2e_cross_signing_keys", "e2e_cross_signing_keys_sequence",
        _t(("e2e_cross_signing_keys", "instance_name", "stream_id")),
        wire=None),
    SynapseIdStream(
        "events", "events_stream_seq",
        _t(("events", "instance_name", "stream_ordering"),
           ("current_state_delta_stream", "instance_name", "stream_id"),
           ("ex_outlier_stream", "instance_name", "event_stream_ordering")),
        wire="events", writers_setting="events"),
    SynapseIdStream(
        "backfill", "events_backfill_stream_seq",
        _t(("events", "instance_name", "stream_ordering"),
           ("ex_outlier_stream", "instance_name", "event_stream_ordering")),
        wire="backfill", writers_setting="events", positive=False),
    SynapseIdStream(
        "un_partial_stated_event_stream", "un_partial_stated_event_stream_sequence",
        _t(("un_partial_stated_event_stream", "instance_name", "stream_id")),
        wire="un_partial_stated_event", fixed_writers=("master",)),
    SynapseIdStream(
        "presence_stream", "presence_stream_sequence",
        _t(("presence_stream", "instance_name", "stream_id")),
        wire="presence", writers_setting="presence"),
    SynapseIdStream(
        "profile_updates", "profile_updates_sequence",
        _t(("profile_updates", "instance_name", "stream_id")),
        wire="profile_updates", writers_setting="events"),
    SynapseIdStream(
        "push_rules_stream", "push_rules_stream_sequence",
        _t(("push_rules_stream", "instance_name", "stream_id")),
        wire="push_rules", writers_setting="push_rules"),
    SynapseIdStream(
        "pushers", "pushers_sequence",
        _t(("pushers", "instance_name", "id"),
           ("deleted_pushers", "instance_name", "stream_id")),
        wire="pushers", fixed_writers=("master",)),
    SynapseIdStream(
        "receipts", "receipts_sequence",
        _t(("receipts_linearized", "instance_name", "stream_id")),
        wire="receipts", writers_setting="receipts"),
    SynapseIdStream(
        "un_partial_stated_room_stream", "un_partial_stated_room_stream_sequence",
        _t(("un_partial_stated_room_stream", "instance_name", "stream_id")),
        wire="un_partial_stated_room", fixed_writers=("master",)),
    SynapseIdStream(
        "quarantined_media", "quarantined_media_id_seq",
        _t(("quarantined_media_changes", "instance_name", "stream_id")),
        wire="quarantined_media", writers_setting="quarantined_media_changes"),
    SynapseIdStream(
        "sticky_events", "sticky_events_sequence",
        _t(("sticky_events", "instance_name", "stream_id")),
        wire="sticky_events", writers_setting="events"),
    SynapseIdStream(
        "thread_subscriptions", "thread_subscriptions_sequence",
        _t(("thread_subscriptions", "instance_name", "stream_id")),
        wire="thread_subscriptions", writers_setting="thread_subscriptions"),
)

_BY_NAME = {s.name: s for s in SYNAPSE_ID_STREAMS}


def by_name(name: str) -> SynapseIdStream:
    """The stream recorded as ``name`` in ``stream_positions`` (KeyError if Synapse has none)."""
    return _BY_NAME[name]
