"""``factstream positions``: stream x writer positions, from a database and from live writers.

It reads, never writes: a database that does not exist is an error, not a
new empty file. On a factstream or a Synapse database it shows every
stream by its wire name (``device_lists``, not ``device_lists_stream``),
with the position each writer last recorded (``stream_positions``) and the
highest id in the stream's own tables; the replication column comes from writers
answering REPLICATE over TCP (``--connect``) or Redis (``--redis``).

On a Synapse database it also computes each stream's persisted-up-to
position the way Synapse's ``MultiWriterIdGenerator._load_current_ids``
does at startup in a process that does not write the stream (a writer also
moves up through its own rows and, on PostgreSQL, takes its sequence's
value): ``stream_positions`` rows of instances that are not writers
of the stream are set aside (Synapse deletes them), the lowest remaining
position is the start, and ids written without a gap above it move it up.
Which instances write a stream comes from the Synapse config (``--config``)
or ``--instances``; without them only the writers Synapse hard-codes are known.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import transport
from ..redaction import redact_text, redact_url
from . import dbtimeout, missing_sqlite
from .argtypes import duration

PROG = "factstream positions"

COLUMNS_HELP = (
    "Columns: 'recorded' is the position the writer last saved in the stream_positions table (where a restarted "
    "writer resumes); 'max_stream_id' is the highest stream id of that writer in the stream's own table(s) (ids above "
    "'recorded' are facts written since); 'replication' is the position the running writer announces to a reader "
    "that sends REPLICATE (--connect or --redis), read at the time printed in the header. '-' means none. "
    "backfill's ids count down (-1, -2, ...) in Synapse's tables and stream_positions: every column shows their "
    "magnitude, as the replication wire does. On a Synapse database, 'persisted up to' is the stream's position as "
    "Synapse computes it at startup in a process that does not write the stream: the lowest position recorded by a "
    "writer of the stream, then the ids above it without a gap; a stream_positions row of an instance that does not "
    "write the stream (per --config or --instances) is set aside as stale, as Synapse deletes it, and a note says so."
)

#: Ids read per query while following a gap-free run above the lowest recorded position.
RUN_PAGE = 10_000

#: Synapse's ``stream_positions.stream_name`` -> the stream's wire name.
SYNAPSE_DB_NAMES: dict[str, str] = {
    "events": "events", "backfill": "backfill", "presence_stream": "presence", "receipts": "receipts",
    "push_rules_stream": "push_rules", "pushers": "pushers", "caches": "caches",
    "device_lists_stream": "device_lists", "to_device": "to_device", "account_data": "account_data",
    "thread_subscriptions": "thread_subscriptions", "profile_updates": "profile_updates",
    "sticky_events": "sticky_events", "quarantined_media": "quarantined_media",
    "un_partial_stated_room_stream": "un_partial_stated_room",
    "un_partial_stated_event_stream": "un_partial_stated_event",
}

#: Wire stream -> (table, id column) pairs holding its facts (Synapse's layout; factstream's own tables too).
STREAM_TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "events": (("events", "stream_ordering"), ("current_state_delta_stream", "stream_id"),
               ("ex_outlier_stream", "event_stream_ordering")),
    "backfill": (("events", "-stream_ordering"),),
    "presence": (("presence_stream", "stream_id"),),
    "receipts": (("receipts_linearized", "stream_id"), ("demo_receipts", "stream_id")),
    "push_rules": (("push_rules_stream", "stream_id"),),
    "pushers": (("pushers", "id"), ("deleted_pushers", "stream_id")),
    "caches": (("cache_invalidation_stream_by_instance", "stream_id"), ("demo_caches", "stream_id")),
    "device_lists": (("device_lists_stream", "stream_id"), ("user_signature_stream", "stream_id"),
                     ("device_lists_outbound_pokes", "stream_id"), ("device_lists_changes_in_room", "stream_id"),
                     ("device_lists_remote_pending", "stream_id")),
    "to_device": (("device_inbox", "stream_id"), ("device_federation_outbox", "stream_id"),
                  ("demo_to_device", "stream_id")),
    "account_data": (("room_account_data", "stream_id"), ("room_tags_revisions", "stream_id"),
                     ("account_data", "stream_id")),
    "thread_subscriptions": (("thread_subscriptions", "stream_id"),),
    "profile_updates": (("profile_updates", "stream_id"),),
    "sticky_events": (("sticky_events", "stream_id"),),
    "quarantined_media": (("quarantined_media_changes", "stream_id"),),
    "un_partial_stated_room": (("un_partial_stated_room_stream", "stream_id"),),
    "un_partial_stated_event": (("un_partial_stated_event_stream", "stream_id"),),
}

#: Streams whose ids count down: their positions and ids are shown as magnitudes.
BACKWARDS = frozenset(stream for stream, sources in STREAM_TABLES.items() if sources[0][1].startswith("-"))

FACTSTREAM_MARKERS = {"demo_to_device", "demo_receipts", "demo_caches", "event_store_counters"}
SYNAPSE_MARKERS = {"event_forward_extremities", "room_memberships", "device_lists_stream", "receipts_linearized"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "positions",
        help="show stream positions per writer (database and/or live writers)",
        description="Print a stream x writer table of positions from a database (read only: it is never created) "
                    "and as live writers announce them. " + COLUMNS_HELP,
        epilog="example: factstream positions --db sqlite:///factstream.db --connect 127.0.0.1:9092",
    )
    p.add_argument("--db", default=None, help="database URL (sqlite:///file.db or postgresql://...; PostgreSQL gets 10 s to answer, "
                        "?connect_timeout=SECONDS in the URL to change); read only")
    p.add_argument("--connect", metavar="HOST:PORT",
                   help="also ask a writer's TCP replication listener (REPLICATE); not with --redis")
    p.add_argument("--redis", metavar="URL",
                   help="also ask a Redis deployment's writers (needs --server-name); not with --connect")
    p.add_argument("--server-name", help="with --redis: the deployment's channel; with --connect: the expected name")
    # None: not given (they apply to --connect/--redis only; the defaults are filled in once that is checked)
    p.add_argument("--wait", type=duration(), help="with --connect/--redis: seconds to collect POSITION answers "
                   "(default 1)")
    p.add_argument("--connect-timeout", type=duration(), metavar="SECONDS",
                   help="with --connect/--redis: give up connecting after this long (default 10; a refused "
                   "connection is retried until then)")
    dbtimeout.add_option(p, "with --db: ")
    p.add_argument("--tls", action="store_true", help="with --connect: connect with TLS (verifying the server)")
    p.add_argument("--cafile", help="with --connect: CA certificate to verify the server with (implies --tls)")
    p.add_argument("--insecure", action="store_true", help="with --tls: do not verify the certificate (not recommended)")
    p.add_argument("-c", "--config", action="append", metavar="PATH",
                   help="with --db on a Synapse database: its config file or directory (of *.yaml files), repeatable "
                        "and merged as Synapse merges its -c options; its stream_writers say which stream_positions "
                        "rows Synapse sets aside as stale")
    p.add_argument("--instances", metavar="A,B,...",
                   help="with --db on a Synapse database: every configured Synapse instance name (instead of --config); "
                        "a stream_positions row of any other instance is set aside as stale")
    p.add_argument("--json", action="store_true", help="print JSON (a row's 'stale' says why it was set aside; "
                   "'persisted_upto' is its stream's persisted-up-to position)")
    p.set_defaults(func=run)


class Foreign(Exception):
    """Not a factstream or Synapse database."""


def check_sqlite_exists(url: str) -> None:
    """A SQLite URL must name an existing file: positions never creates one."""
    problem = missing_sqlite(url, "positions")
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        raise SystemExit(2)  # a missing file named by an option: a usage error


def db_url_problem(url: str) -> tuple[int, str] | None:
    """(exit status, message) for a --db that names no database, before anything connects; None if fine.

    A URL written wrong (a bare path, ``sqlite://t.db``, a host without its
    ``]``) is a usage error with the form to write; a directory is named as
    one rather than as "no database at".
    """
    from ..store.database import DatabaseURLError, check_url, sqlite_path

    try:
        engine = check_url(url)
    except DatabaseURLError as err:
        return 2, f"--db: {err}"
    if engine == "sqlite" and os.path.isdir(path := sqlite_path(url)):
        return 1, f"{path!r} is a directory, not a database file; give the writer's --db URL"
    return None


def check_options(args: argparse.Namespace) -> str | None:
    """The first option given that positions would ignore or cannot use, as a usage message (None: fine).

    --connect and --redis are two ways to reach the writers and --server-name
    means something different to each: one of them, never both.
    """
    if args.connect and args.redis:
        return ("give either --connect HOST:PORT (a TCP listener) or --redis URL --server-name NAME, not both "
                "(run positions twice to ask both)")
    if args.redis and not args.server_name:
        return "--redis needs --server-name NAME (the deployment's channel)"
    if not args.connect and (args.tls or args.cafile or args.insecure):
        return "--tls/--cafile/--insecure apply to --connect HOST:PORT (for Redis over TLS use a rediss:// URL)"
    if args.server_name and not (args.connect or args.redis):
        return "--server-name applies to --connect or --redis"
    given = [flag for flag, value in (("--wait", args.wait), ("--connect-timeout", args.connect_timeout))
             if value is not None]
    if args.config and args.instances:
        return "give either --config PATH or --instances A,B,..., not both (the config names the writers per stream)"
    if (args.config or args.instances) and not args.db:
        return f"{'--config' if args.config else '--instances'} applies to --db URL (a Synapse database's stream_positions)"
    if args.db_timeout is not None and not args.db and (args.connect or args.redis):
        return "--db-timeout applies to --db URL (reading a database)"
    if given and not (args.connect or args.redis):
        return f"{'/'.join(given)} {'applies' if len(given) == 1 else 'apply'} to --connect or --redis (asking live writers)"
    return None


async def _tables(db: Any) -> dict[str, set[str]]:
    """Table name -> its column names."""
    out: dict[str, set[str]] = {}
    if db.engine == "sqlite":
        for (name,) in await db.fetchall("SELECT name FROM sqlite_master WHERE type = 'table'", ()):
            cols = await db.fetchall(f'PRAGMA table_info("{name}")', ())
            out[name] = {c[1] for c in cols}
    else:
        for name, col in await db.fetchall(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()", ()
        ):
            out.setdefault(name, set()).add(col)
    return out


async def _leading_columns(db: Any, names: set[str]) -> set[tuple[str, str]]:
    """(table, column) pairs, among ``names``, where the column leads a whole-table B-tree index.

    Only such a column answers ``MAX`` or ``ORDER BY ... LIMIT 1`` by reading
    one index entry, and a ``WHERE column > bound`` by a range scan; without
    one each query is a scan of the table, so a table lacking it is read once,
    whole, rather than once per question.
    """
    out: set[tuple[str, str]] = set()
    if db.engine != "sqlite":
        for table, column in await db.fetchall(
            "SELECT t.relname, a.attname FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid "
            "JOIN pg_class x ON x.oid = i.indexrelid JOIN pg_am am ON am.oid = x.relam "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
            "WHERE t.relnamespace = to_regnamespace(current_schema())::oid AND am.amname = 'btree' "
            "AND i.indpred IS NULL AND i.indisvalid", ()
        ):
            if table in names:
                out.add((str(table), str(column)))
        return out
    for table in names:
        for _seq, index, *rest in await db.fetchall(f'PRAGMA index_list("{table}")', ()):
            if len(rest) >= 3 and rest[2]:  # a partial index holds only some rows
                continue
            first = [c for seqno, _cid, c in await db.fetchall(f'PRAGMA index_info("{index}")', ()) if seqno == 0]
            if first and first[0]:
                out.add((table, str(first[0])))
        pk = [c for c in await db.fetchall(f'PRAGMA table_info("{table}")', ()) if c[5]]
        if len(pk) == 1 and str(pk[0][2]).upper() == "INTEGER":  # the rowid itself
            out.add((table, str(pk[0][1])))
    return out


async def _stream_maxima(db: Any, sources: list[tuple[str, str]], tables: dict[str, set[str]],
                         indexed: set[tuple[str, str]], bound: int | None) -> dict[str, int]:
    """Writer -> highest id in the stream's tables (magnitudes for a backwards stream such as backfill).

    ``bound`` is the lowest position recorded for the stream in
    ``stream_positions``: a writer's rows above its recorded position all lie
    above it, so where the id column is indexed only those rows are read, plus
    the table's top row (one index entry). A writer whose rows all lie at or
    below the bound is then left out, unless it holds the stream's top id,
    since a figure of it could be short of its true highest id. Without a bound
    (no recorded position, as Synapse's caches) or an index, every row is read
    and every writer kept.
    """
    found: dict[str, int] = {}
    top = 0
    bounded = False  # some table read above the bound only: figures at or below it may be short

    def note(writer: Any, value: Any) -> None:
        nonlocal top
        if value is not None and int(value) > 0:
            found[str(writer)] = max(int(value), found.get(str(writer), 0))
            top = max(top, int(value))

    for table, col in sources:
        column, backwards = col.lstrip("-"), col.startswith("-")
        # magnitude of an id, ids of the stream, ids above a magnitude, and the order putting the top first
        value = f"-{column}" if backwards else column
        ids = f"{column} < 0" if backwards else f"{column} > 0"
        above = f"{column} < ?" if backwards else f"{column} > ?"
        newest = f"{column} ASC" if backwards else f"{column} DESC"
        if "instance_name" not in tables[table]:
            # no GROUP BY: PostgreSQL then reads the one index entry at the end instead of every row
            row = await db.fetchone(f"SELECT {'-MIN' if backwards else 'MAX'}({column}) FROM {table} WHERE {ids}", ())
            note("master", row[0] if row else None)
            continue
        who = "COALESCE(instance_name, 'master')"
        agg = f"{'-MIN' if backwards else 'MAX'}({column})"
        if bound is None or (table, column) not in indexed:
            for inst, mx in await db.fetchall(f"SELECT {who}, {agg} FROM {table} WHERE {ids} GROUP BY 1", ()):
                note(inst, mx)
            continue
        bounded = True
        limit = -max(bound, 0) if backwards else max(bound, 0)
        rows = await db.fetchall(f"SELECT {who}, {agg} FROM {table} WHERE {above} GROUP BY 1", (limit,))
        for inst, mx in rows:
            note(inst, mx)
        if not rows:  # nothing above the bound: the table's top row alone
            row = await db.fetchone(f"SELECT {who}, {value} FROM {table} WHERE {ids} ORDER BY {newest} LIMIT 1", ())
            if row:
                note(row[0], row[1])
    if bound is None or not bounded:
        return found
    return {w: v for w, v in found.items() if v > bound or v == top}


@dataclass(frozen=True)
class Writers:
    """Which instances write each Synapse stream, as far as positions can tell, and where that came from.

    ``per_stream`` maps a ``stream_positions`` name to its writers (an empty
    tuple: any process writes it and Synapse records no position); a stream
    missing from it has writers nobody told positions about. ``source`` names
    them in notes (``stream_writers`` of a config, ``--instances``).
    """

    per_stream: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = ""
    setting: Mapping[str, str] = field(default_factory=dict)


def configured_writers(config: list[str] | None, instances: str | None) -> Writers:
    """The writers of every Synapse stream from ``--config`` or ``--instances``; the hard-coded ones otherwise.

    Synapse sets a ``stream_positions`` row aside by its writers list alone
    (``MultiWriterIdGenerator._load_current_ids`` deletes rows of other
    instances), so without that list only the streams whose writers Synapse
    fixes in code can be judged. Raises ConfigError for a config Synapse
    itself would refuse.
    """
    from ..synapse.config import load_config
    from ..synapse.streams import SYNAPSE_ID_STREAMS

    fixed = {s.name: s.fixed_writers for s in SYNAPSE_ID_STREAMS if not s.writers_setting}
    if config:
        cfg = load_config(config)
        for note in cfg.notes:
            print(f"{PROG}: note: {redact_text(note)}", file=sys.stderr)
        return Writers({s.name: cfg.writers_of(s) for s in SYNAPSE_ID_STREAMS}, cfg.source,
                       {s.name: s.writers_setting for s in SYNAPSE_ID_STREAMS if s.writers_setting})
    if instances:
        names = tuple(i.strip() for i in instances.split(",") if i.strip())
        given = {s.name: names for s in SYNAPSE_ID_STREAMS if s.writers_setting}
        return Writers({**fixed, **given}, "--instances")
    return Writers(fixed)


def _stale_reason(stream: Any, instance: str, writers: Writers) -> str:
    """Why Synapse does not count ``instance``'s row of ``stream`` (a SynapseIdStream)."""
    if not stream.records_positions:
        return (f"Synapse records no positions for {stream.name} (any process writes it) and never reads this row "
                "(left by an older Synapse)")
    if not stream.writers_setting:
        return (f"Synapse has {', '.join(stream.fixed_writers)} alone write {stream.name} (fixed in its code); it "
                "deletes this row when one of its processes starts")
    if writers.source == "--instances":
        where = f"{instance!r} is not among --instances"
    else:
        setting = writers.setting.get(stream.name, stream.writers_setting)
        where = (f"{instance!r} is not in stream_writers.{setting} of {writers.source} "
                 f"({', '.join(writers.per_stream[stream.name])})")
    return f"{where}; Synapse deletes this row when one of its processes starts"


@dataclass
class DbReading:
    """What ``--db`` gave: the kind of database, its cells and, on Synapse's, what Synapse makes of them.

    ``cells``: (stream, writer) -> {"recorded", "max_stream_id"} (magnitudes);
    ``listed``: streams shown even without rows; ``persisted``: wire stream ->
    its persisted-up-to position; ``stale``: (stream, writer) -> why its row
    was set aside; ``unjudged``: wire stream -> the instances whose rows were
    all counted for want of the configured writers.
    """

    kind: str
    cells: dict[tuple[str, str], dict[str, int]]
    listed: list[str]
    persisted: dict[str, int] = field(default_factory=dict)
    stale: dict[tuple[str, str], str] = field(default_factory=dict)
    unjudged: dict[str, list[str]] = field(default_factory=dict)


async def _persisted_upto(db: Any, stream: Any, tables: dict[str, set[str]], low: int | None) -> int:
    """The persisted-up-to position of ``stream`` (a SynapseIdStream; a magnitude), as Synapse loads it.

    ``low`` is the lowest position its writers recorded. Without one Synapse
    takes the highest id of the stream's tables (at least 1); with one it
    starts there and moves up through the ids found above it as long as they
    follow each other without a gap (``_add_persisted_position``). The run is
    read a page of ids at a time, so a gap near the start stops it early.
    """
    sources = [(t.table, t.id_column) for t in stream.tables if t.table in tables and t.id_column in tables[t.table]]
    if low is None:
        best = 1
        for table, column in sources:
            row = await db.fetchone(f"SELECT {'MAX' if stream.positive else '-MIN'}({column}) FROM {table}", ())
            if row and row[0] is not None:
                best = max(best, int(row[0]))
        return best
    pos = low
    while True:
        page_end = pos + RUN_PAGE
        ids: set[int] = set()
        for table, column in sources:
            if stream.positive:
                sql, params = f"SELECT {column} FROM {table} WHERE {column} > ? AND {column} <= ?", (pos, page_end)
            else:
                sql, params = f"SELECT -{column} FROM {table} WHERE {column} < ? AND {column} >= ?", (-pos, -page_end)
            ids.update(int(v) for (v,) in await db.fetchall(sql, params))
        while pos + 1 in ids:
            pos += 1
        if pos < page_end:
            return pos


async def read_db(url: str, timeout: float = dbtimeout.DEFAULT, writers: Writers | None = None) -> DbReading:
    """Read ``url``'s positions, and on a Synapse database what Synapse makes of them.

    ``timeout``: the --db-timeout it runs under (SQLite waits for a lock no
    longer). ``writers``: who writes each Synapse stream (default: only the
    writers Synapse hard-codes are known).
    """
    from ..store.database import connect
    from ..synapse.streams import by_name

    writers = writers or Writers()
    check_sqlite_exists(url)
    out: dict[tuple[str, str], dict[str, int]] = {}
    reading = DbReading("factstream", out, [])
    db = await connect(dbtimeout.bounded_url(url, timeout))
    dbtimeout.watch(db)  # under a --db-timeout: its queries are cancelled at the deadline
    try:
        tables = await _tables(db)
        if not tables:
            raise Foreign(f"{redact_url(url)} is empty: no tables at all (not a factstream or Synapse database)")
        synapse = bool(SYNAPSE_MARKERS & tables.keys())
        ours = bool(FACTSTREAM_MARKERS & tables.keys())
        if not synapse and not ours and "stream_positions" not in tables:
            raise Foreign(f"{redact_url(url)} is not a factstream or Synapse database (no stream tables among its "
                          f"{len(tables)} tables)")
        # the positions that count, as magnitudes: a stale row is shown but is no writer's position
        counted: dict[str, list[int]] = {}
        id_streams: dict[str, Any] = {}
        if "stream_positions" in tables:
            for stream, inst, sid in await db.fetchall(
                "SELECT stream_name, instance_name, stream_id FROM stream_positions", ()
            ):
                wire = SYNAPSE_DB_NAMES.get(str(stream), str(stream)) if synapse else str(stream)
                # backwards streams: Synapse records -position, factstream the position itself
                value = abs(int(sid)) if wire in BACKWARDS else int(sid)
                out.setdefault((wire, str(inst)), {})["recorded"] = value
                try:
                    sid_stream = by_name(str(stream)) if synapse else None
                except KeyError:
                    sid_stream = None
                if sid_stream is not None:
                    id_streams[wire] = sid_stream
                    known = writers.per_stream.get(sid_stream.name)
                    if known is not None and (not sid_stream.records_positions or str(inst) not in known):
                        reading.stale[(wire, str(inst))] = _stale_reason(sid_stream, str(inst), writers)
                        continue
                    if known is None:
                        reading.unjudged.setdefault(wire, []).append(str(inst))
                counted.setdefault(wire, []).append(value)
        present = {stream: [(t, c) for t, c in sources if t in tables and c.lstrip("-") in tables[t]]
                   for stream, sources in STREAM_TABLES.items()}
        indexed = await _leading_columns(db, {t for sources in present.values() for t, _ in sources})
        for stream, sources in present.items():
            if not sources:
                continue
            marks = counted.get(stream, [])
            maxima = await _stream_maxima(db, sources, tables, indexed, min(marks) if marks else None)
            for inst, mx in maxima.items():
                out.setdefault((stream, inst), {})["max_stream_id"] = mx
        if synapse:
            from ..synapse.streams import SYNAPSE_ID_STREAMS

            for sid_stream in SYNAPSE_ID_STREAMS:
                if sid_stream.wire is None or sid_stream.wire not in STREAM_TABLES:
                    continue
                marks = counted.get(sid_stream.wire, []) if sid_stream.records_positions else []
                reading.persisted[sid_stream.wire] = await _persisted_upto(
                    db, sid_stream, tables, min(marks) if marks else None)
        reading.unjudged = {w: sorted(i) for w, i in reading.unjudged.items() if len(i) > 1}
    finally:
        await db.close()
    from ..streams.registry import SYNAPSE_STREAMS

    reading.listed = [d.name for d in SYNAPSE_STREAMS] if synapse else []
    reading.kind = "synapse" if synapse else "factstream"
    return reading


async def db_positions(url: str, timeout: float = dbtimeout.DEFAULT) -> tuple[
        str, dict[tuple[str, str], dict[str, int]], list[str]]:
    """(kind, (stream, writer) -> {"recorded", "max_stream_id"}, streams to list even without rows).

    ``timeout``: the --db-timeout it runs under (SQLite waits for a lock no longer).
    The figures of :func:`read_db`, for commands that want only them (``tail --db``).
    """
    reading = await read_db(url, timeout)
    return reading.kind, reading.cells, reading.listed


async def live_positions(args: argparse.Namespace) -> dict[tuple[str, str], int]:
    """(stream, writer) -> position announced by the writer at --connect, after REPLICATE."""
    from ..transport.tcp import client_ssl_context
    from .link import LinkError, LinkOptions, parse_target
    from .link import connect_within

    host, port = parse_target(args.connect, PROG)
    ssl = None
    if args.tls or args.cafile or args.insecure:
        ssl = client_ssl_context(args.cafile, verify=not args.insecure)
    opts = LinkOptions(host, port, client_name="factstream-positions", expected_server_name=args.server_name,
                       connect_timeout=args.connect_timeout, ssl=ssl)
    try:
        link = await connect_within(opts, quiet=True)
    except LinkError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    got: dict[tuple[str, str], int] = {}
    deadline = time.monotonic() + args.wait
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                chunk = await asyncio.wait_for(link.read(), left)
            except TimeoutError:
                break
            _positions_from(chunk.split(b"\n"), got)
    except LinkError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        await link.close()
    return got


def _positions_from(lines: list[bytes], got: dict[tuple[str, str], int]) -> None:
    for line in lines:
        if line.startswith(b"POSITION "):
            f = line.decode("utf-8", "replace").split(" ")
            if len(f) >= 5 and f[4].lstrip("-").isdigit():
                got[(f[1], f[2])] = int(f[4])
        elif line.startswith(b"RDATA "):
            f = line.decode("utf-8", "replace").split(" ", 4)
            if len(f) >= 4 and f[3].lstrip("-").isdigit():
                got[(f[1], f[2])] = max(int(f[3]), got.get((f[1], f[2]), 0))


async def redis_positions(args: argparse.Namespace) -> dict[tuple[str, str], int]:
    """(stream, writer) -> position, from the POSITION answers to one REPLICATE published on the channel."""
    import redis.asyncio as aioredis

    from .link import check_redis

    await check_redis(args.redis, args.server_name, PROG, args.connect_timeout)
    got: dict[tuple[str, str], int] = {}
    client = aioredis.from_url(args.redis)
    try:
        pubsub = client.pubsub()
        await pubsub.subscribe(args.server_name)
        await client.publish(args.server_name, b"REPLICATE ")
        deadline = time.monotonic() + args.wait
        while (left := deadline - time.monotonic()) > 0:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            if msg and isinstance(msg.get("data"), bytes):
                _positions_from([msg["data"]], got)
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: PubSub.aclose is unannotated
    finally:
        await client.aclose()
    return got


async def positions(args: argparse.Namespace) -> int:
    problem = check_options(args)
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    # not given: the defaults (None told check_options whether they were typed)
    args.wait = 1.0 if args.wait is None else args.wait
    args.db_timeout = dbtimeout.seconds(args.db_timeout)
    args.connect_timeout = 10.0 if args.connect_timeout is None else args.connect_timeout
    if not args.db and not args.connect and not args.redis:
        if not os.path.isfile("factstream.db"):
            print(f"{PROG}: say what to read: --db URL (a writer's database), --connect HOST:PORT or "
                  "--redis URL --server-name NAME (there is no ./factstream.db here)", file=sys.stderr)
            return 2
        args.db = "sqlite:///factstream.db"
    if args.db and (bad := db_url_problem(args.db)):
        print(f"{PROG}: {bad[1]}", file=sys.stderr)
        return bad[0]
    if args.db:
        check_sqlite_exists(args.db)  # here, not in the read's task: a SystemExit there is logged as never retrieved
    writers = Writers()
    if args.config or args.instances:
        from ..synapse.config import ConfigError

        try:
            writers = configured_writers(args.config, args.instances)
        except ConfigError as err:
            print(f"{PROG}: {redact_text(str(err))}", file=sys.stderr)
            return 2
    table: dict[tuple[str, str], dict[str, Any]] = {}
    header: dict[str, Any] = {}
    listed: list[str] = []
    reading = DbReading("factstream", {}, [])
    status = 0

    async def from_db() -> None:
        nonlocal listed, reading
        reading = await read_db(args.db, args.db_timeout, writers)
        listed = reading.listed
        header["database"] = {"url": redact_url(args.db), "kind": reading.kind, "read_at": _now()}
        for k, v in reading.cells.items():
            table.setdefault(k, {}).update(v)

    async def from_live() -> None:
        live = await (redis_positions(args) if args.redis else live_positions(args))
        header["live"] = {"from": redact_url(args.redis) if args.redis else args.connect, "read_at": _now()}
        for k, pos in live.items():
            table.setdefault(k, {})["replication"] = pos

    jobs = ([dbtimeout.within(from_db(), args.db_timeout, args.db)] if args.db else []) + (
        [from_live()] if args.connect or args.redis else [])
    try:
        await asyncio.gather(*jobs)  # database and live writers read at the same moment
    except (Foreign, dbtimeout.NoAnswer) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    if (args.config or args.instances) and reading.kind != "synapse":
        print(f"{PROG}: {'--config' if args.config else '--instances'} applies to a Synapse database; "
              f"{redact_url(args.db)} is factstream's (its writers are whoever recorded a position)", file=sys.stderr)
        return 2
    for stream in listed:
        if not any(s == stream for s, _ in table):
            table[(stream, "-")] = {}
    if args.json:
        print(json.dumps([{"stream": s, "writer": w, **v,
                           **({"persisted_upto": reading.persisted[s]} if s in reading.persisted else {}),
                           **({"stale": reading.stale[(s, w)]} if (s, w) in reading.stale else {})}
                          for (s, w), v in sorted(table.items())], separators=(",", ":")))
        return status
    from ..streams.registry import SYNAPSE_STREAMS

    in_memory = {d.name for d in SYNAPSE_STREAMS if d.in_memory}
    for what, h in header.items():
        print(f"# {what}: {h.get('url') or h.get('from')} ({h.get('kind', 'writers')}), read at {h['read_at']}")
    answered = any("replication" in v for v in table.values())
    if (args.connect or args.redis) and not answered:
        # with --db the table is full of database rows, and an empty replication column read as "no
        # positions announced" rather than as a wrong --server-name (a Redis channel nobody writes on)
        where = f"on channel {args.server_name!r}" if args.redis else f"at {args.connect}"
        print(f"# no writer answered REPLICATE {where} within {args.wait:g}s"
              + (" (check --server-name)" if args.redis else ""))
    if args.db and not any(table.values()):
        print("# no positions: the database has no facts yet")
    cols = ["recorded", "max_stream_id", "replication"]
    print(f"{'stream':<26} {'writer':<14} " + " ".join(f"{c:>13}" for c in cols))
    for (s, w), v in sorted(table.items()):
        cells = [str(v.get(c, "-")) for c in cols]
        if s in in_memory and not v:
            cells = ["in memory", "-", "-"]
        print(f"{s:<26} {w:<14} " + " ".join(f"{c:>13}" for c in cells))
    for line in db_notes(reading):
        print(line)
    return status


def db_notes(reading: DbReading) -> list[str]:
    """The lines under the table saying what Synapse makes of ``stream_positions``.

    A stale row stays in the table (it is in the database) but is no writer's
    position: the note says so and why, so that its low figure is not read as
    a writer holding the stream back.
    """
    if reading.kind != "synapse":
        return []
    lines = []
    if reading.persisted:
        lines.append("# persisted up to (each stream's position as a Synapse process that does not write it computes "
                     "it at startup: the lowest position recorded by its writers, then the ids above it without a gap): "
                     + ", ".join(f"{s} {v}" for s, v in sorted(reading.persisted.items())))
    for (s, w), why in sorted(reading.stale.items()):
        recorded = reading.cells.get((s, w), {}).get("recorded", "-")
        lines.append(f"# stale: {s}/{w} (recorded {recorded}) set aside, not counted in persisted up to: {why}")
    for s, instances in sorted(reading.unjudged.items()):
        lines.append(f"# {s}: positions of {', '.join(instances)} all counted; give --config or --instances to set "
                     "aside rows of instances that no longer write it, as Synapse does")
    return lines


def _now() -> str:
    from .link import utc_stamp

    return utc_stamp()


def run(args: argparse.Namespace) -> int:
    return transport.run(lambda: positions(args))
