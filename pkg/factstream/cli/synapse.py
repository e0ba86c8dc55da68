"""``factstream synapse``: a doctor for a Synapse database and a watchdog for its replication.

``check`` reads (never writes, unless ``--fix``) the sequences, stream tables
and ``stream_positions`` of a Synapse database and explains every
inconsistency with its likely cause and the SQL that repairs it. Exit status:
0 healthy, 1 inconsistencies found (or left after ``--fix``), 2 could not check.
``watch`` follows a live deployment over Redis (see docs/synapse.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Collection
from typing import Any

from ..redaction import redact_text, redact_url
from . import dbtimeout
from .argtypes import duration, port

EXIT_HEALTHY, EXIT_INCONSISTENT, EXIT_CANNOT_CHECK = 0, 1, 2


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "synapse",
        help="check a Synapse database's streams, or watch a live deployment's replication",
        description="Tools for operators of a Synapse deployment (see docs/synapse.md).",
    )
    sub = p.add_subparsers(dest="synapse_command", metavar="SUBCOMMAND")
    c = sub.add_parser(
        "check",
        help="check sequences, stream tables and stream_positions of a Synapse database",
        description=(
            "Read a Synapse database and report each inconsistency between its sequences, stream tables and "
            "stream_positions, with its likely cause and the SQL that repairs it. Nothing is written unless "
            "--fix. Exit status: 0 healthy, 1 inconsistencies, 2 could not check."
        ),
    )
    c.add_argument("--db", metavar="URL", help="Synapse's database: postgresql://user@host:port/synapse or sqlite:///path")
    c.add_argument("-c", "--config", action="append", metavar="PATH",
                   help="Synapse config file or directory (of *.yaml files), repeatable and merged as Synapse merges "
                        "its -c options: its stream_writers tell stale writers apart (and its database is used "
                        "without --db)")
    c.add_argument("--instances", metavar="A,B,...", help="every configured Synapse instance name (instead of --config)")
    c.add_argument("--fix", action="store_true", help="apply the repairs in one transaction (Synapse must be stopped)")
    c.add_argument("--force", action="store_true", help="with --fix: repair even while other sessions are connected")
    c.add_argument("--json", action="store_true", help="print one JSON document")
    dbtimeout.add_option(c, note="; it bounds the connect and the check, then each step of --fix (exit 2)")
    c.set_defaults(func=run_check)
    w = sub.add_parser(
        "watch",
        help="follow a live deployment's replication over Redis and report whether every stream flows",
        description=(
            "Subscribe to a Synapse deployment's replication channel on Redis and report, every --interval, each "
            "(stream, writer)'s token, rows/s and idle time; with a database (--db, or the database section of "
            "--config) also how far the wire is behind the database, "
            "frozen streams and committed rows the wire skipped. Human output, JSON lines (--json) and/or "
            "Prometheus metrics (--metrics-port). Exit status with --duration: 0 healthy at the end, 1 not (a problem, or "
            "no writer heard on the channel: check --server-name), 2 could not watch (Redis never reached, database "
            "unreachable or not Synapse's, metrics endpoint cannot listen, config unreadable). With --config, also "
            "each configured writer that never answers on the channel (a dead worker) and each writer heard that "
            "the config does not name; --redis, --server-name and --db default to the config's."
        ),
    )
    w.add_argument("--redis", metavar="URL",
                   help="Synapse's Redis: redis://[:password@]host:port/0 (default: the config's redis section)")
    w.add_argument("--server-name", metavar="HS",
                   help="the homeserver's server_name, the channel (default: the config's server_name)")
    w.add_argument("-c", "--config", action="append", metavar="PATH",
                   help="Synapse config file or directory (of *.yaml files), repeatable and merged as Synapse merges "
                        "its -c options: report configured writers that never answer, and writers it does not name")
    w.add_argument("--db", metavar="URL",
                   help="Synapse's PostgreSQL database, to compare the wire with its rows (default: the config's "
                        "database section)")
    w.add_argument("--no-db", action="store_true",
                   help="watch the wire only: do not connect to the database the config names")
    w.add_argument("--interval", type=duration(), default=5.0, help="seconds between reports (default 5)")
    w.add_argument("--frozen-after", type=duration(), default=30.0, metavar="S",
                   help="seconds before rows the wire has not announced, or a writer left behind, count (default 30)")
    w.add_argument("--metrics-port", type=port, metavar="PORT",
                   help="serve Prometheus metrics on this port (0: any free one, printed on stderr)")
    w.add_argument("--metrics-host", default="127.0.0.1", metavar="ADDR",
                   help="address of the metrics endpoint (default 127.0.0.1; 0.0.0.0 for every interface)")
    w.add_argument("--duration", type=duration(), metavar="S",
                   help="stop after S seconds, with a last report then (default: run until interrupted)")
    w.add_argument("--no-replicate", action="store_true",
                   help="only listen: do not ask writers for their positions on connecting")
    w.add_argument("--json", action="store_true", help="one JSON object per report")
    dbtimeout.add_option(w, "with a database: ",
                         "; at the start that is exit 2, later the probe of that report is cancelled and reported "
                         "as failed, and the next report probes again")
    w.set_defaults(func=run_watch)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _fail(args: argparse.Namespace, message: str) -> int:
    message = redact_text(message)
    print(f"factstream synapse check: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"healthy": None, "error": message}))
    return EXIT_CANNOT_CHECK


def _writers(args: argparse.Namespace) -> tuple[dict[str, Collection[str]] | None, list[str] | None, Any]:
    """(writers per stream, flat instance list, the config's DatabaseSetting or None without --config)."""
    from ..synapse.config import load_config
    from ..synapse.streams import SYNAPSE_ID_STREAMS

    if args.config:
        cfg = load_config(args.config)
        _notes("check", cfg.notes)
        return {s.name: cfg.writers_of(s) for s in SYNAPSE_ID_STREAMS}, None, cfg.database
    fixed: dict[str, Collection[str]] = {s.name: s.fixed_writers for s in SYNAPSE_ID_STREAMS if s.fixed_writers}
    instances = [i.strip() for i in args.instances.split(",") if i.strip()] if args.instances else None
    if instances is None:
        return fixed, None, None
    return fixed, instances, None


def _notes(command: str, notes: Collection[str]) -> None:
    """Say which config paths were skipped (as Synapse skips them), so none is dropped silently."""
    for note in notes:
        print(f"factstream synapse {command}: note: {redact_text(note)}", file=sys.stderr)


def run_check(args: argparse.Namespace) -> int:
    from ..errors import FactstreamError
    from ..synapse.doctor import diagnose
    from ..synapse.snapshot import CheckError, connect, take_snapshot

    try:
        stream_writers, instances, config_db = _writers(args)
    except FactstreamError as err:
        return _fail(args, str(err))
    # An explicit --db wins; else the database Synapse's main store uses, as the config says it connects.
    url, origin = args.db, None
    if not url and config_db is not None:
        if config_db.url is None:
            return _fail(args, str(config_db.error))
        url, origin = config_db.url, config_db.origin
    if not url:
        return _fail(args, "no database: pass --db URL, or --config homeserver.yaml (its database section is used)")
    if args.force and not args.fix:
        return _fail(args, "--force only makes sense with --fix")

    timeout = dbtimeout.seconds(args.db_timeout)

    def read() -> Any:
        conn = connect(url, origin=origin)
        dbtimeout.watch(conn)  # cancelled (or cut) when the database has not answered within --db-timeout
        try:
            return take_snapshot(conn, url, origin)
        finally:
            conn.close()

    def look() -> tuple[Any, list[Any]]:
        snap = dbtimeout.within_thread(read, timeout, url)
        # Streams with writers from the config (or fixed by Synapse) use them; the rest fall back to --instances.
        return snap, diagnose(snap, stream_writers=stream_writers, instances=instances)

    try:
        snapshot, findings = look()
    except (CheckError, dbtimeout.NoAnswer) as err:
        return _fail(args, str(err))
    except Exception as err:  # a driver error mid-check: say what, never how deep
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return _fail(args, f"checking {redact_url(url)} failed: {first}")
    if not args.fix:
        return _show(args, snapshot, findings)
    return _fix(args, url, origin, snapshot, findings, look, timeout)


def _show(args: argparse.Namespace, snapshot: Any, findings: list[Any], extra: dict[str, Any] | None = None) -> int:
    from ..synapse.report import check_json, is_healthy, render_text

    if args.json:
        doc = check_json(snapshot, findings)
        doc.update(extra or {})
        print(json.dumps(doc, indent=1))
    else:
        print(render_text(snapshot, findings))
    return EXIT_HEALTHY if is_healthy(findings) else EXIT_INCONSISTENT


def _fix(args: argparse.Namespace, url: str, origin: str | None, snapshot: Any, findings: list[Any],
         look: Any, timeout: float) -> int:
    from ..synapse.report import check_json, render_text
    from ..synapse.repair import apply_repairs, connected_sessions, repair_statements
    from ..synapse.snapshot import CheckError, connect

    statements = repair_statements(findings)
    if not statements:
        if not args.json:
            print(render_text(snapshot, findings))
            print("nothing to repair")
        else:
            return _show(args, snapshot, findings, {"fixed": []})
        return EXIT_HEALTHY if all(f.severity == "info" for f in findings) else EXIT_INCONSISTENT
    within = dbtimeout.within_thread
    try:
        conn = within(lambda: connect(url, read_only=False, origin=origin), timeout, url)
    except (CheckError, dbtimeout.NoAnswer) as err:
        return _fail(args, str(err))
    try:
        try:
            sessions = within(lambda: connected_sessions(conn, snapshot.engine), timeout, url, watching=[conn])
        except dbtimeout.NoAnswer as err:
            return _fail(args, f"{err}; nothing was repaired")
        if sessions and not args.force:
            print("factstream synapse check: refusing to repair: "
                  f"{len(sessions)} other session(s) connected to the database (is Synapse still running?): "
                  + "; ".join(s.describe() for s in sessions)
                  + ". Stop Synapse and all its workers, or pass --force.", file=sys.stderr)
            if args.json:
                return _show(args, snapshot, findings, {"fixed": [], "refused": [s.describe() for s in sessions]})
            print(render_text(snapshot, findings))
            return EXIT_INCONSISTENT
        try:
            done = within(lambda: apply_repairs(conn, statements), timeout, url, watching=[conn])
        except dbtimeout.NoAnswer as err:
            return _fail(args, f"{err}; the repair transaction was abandoned (PostgreSQL rolls back a transaction "
                               "cut off before its COMMIT): run check again to see what the database holds")
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            return _fail(args, f"repair failed and was rolled back (nothing changed): {first}")
    finally:
        conn.close()
    try:
        after, after_findings = look()
    except Exception as err:  # NoAnswer too: the repair itself was committed
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return _fail(args, f"repaired, but the check afterwards failed: {first}")
    if args.json:
        doc = check_json(after, after_findings)
        doc["before"] = [f.as_json() for f in findings]
        doc["fixed"] = done
        print(json.dumps(doc, indent=1))
    else:
        print(render_text(snapshot, findings, show_table=True))
        print("")
        print(f"--fix: applied {len(done)} repair(s) in one transaction:")
        for d in done:
            print(f"  {d['stream']} ({d['kind']}): {d['sql']}  -> {d['result']}")
        _print_changes(snapshot, after)
        print("")
        print("after the repair:")
        print(render_text(after, after_findings, show_table=False))
    return EXIT_HEALTHY if all(f.severity == "info" for f in after_findings) else EXIT_INCONSISTENT


def _print_changes(before: Any, after: Any) -> None:
    for b, a in zip(before.streams, after.streams):
        name = b.stream.name
        if b.sequence and a.sequence and b.sequence.last_issued != a.sequence.last_issued:
            print(f"  changed: sequence {a.sequence.name} last issued {b.sequence.last_issued} -> {a.sequence.last_issued}")
        for inst in sorted(set(b.positions) | set(a.positions)):
            old, new = b.positions.get(inst), a.positions.get(inst)
            if old != new:
                print(f"  changed: stream_positions {name}/{inst} {'-' if old is None else old} -> {'-' if new is None else new}")


def run_watch(args: argparse.Namespace) -> int:
    from .. import transport
    from ..synapse.snapshot import CheckError
    from ..synapse.watch import WatchError, WatchOptions, run_watch as watch

    def fail(message: str) -> int:
        print(f"factstream synapse watch: {redact_text(message)}", file=sys.stderr)
        return EXIT_CANNOT_CHECK

    if args.db and args.no_db:
        return fail("give either --db URL or --no-db, not both")
    if args.db_timeout is not None and (args.no_db or not (args.db or args.config)):
        return fail("--db-timeout applies to the database (--db URL, or the database section of --config)"
                    + (", which --no-db leaves out" if args.no_db else ""))
    from ..synapse.config import ConfigError, load_config
    from ..synapse.snapshot import url_problem

    postgres = args.db and _scheme(args.db) in ("postgresql", "postgres")
    one_slash = args.db and "://" not in args.db and args.db.lower().startswith(("postgresql:", "postgres:"))
    if (postgres or one_slash) and (problem := url_problem(args.db)):
        return fail(f"--db: {problem}")
    if args.db and not postgres:
        return fail("--db: watch compares the wire with Synapse's PostgreSQL database: give its "
                    "postgresql://host:port/dbname URL (a SQLite Synapse has no workers to watch)")

    cfg = None
    if args.config:
        try:
            cfg = load_config(args.config)
        except ConfigError as err:
            return fail(str(err))
        _notes("watch", cfg.notes)
    redis_url, server_name = args.redis, args.server_name
    if not redis_url:
        if cfg is None:
            return fail("no Redis: pass --redis URL (or --config homeserver.yaml with a redis section)")
        if not cfg.redis_section:
            return fail(f"{cfg.source} has no redis section, so it names no Redis to watch (Synapse's processes "
                        "replicate over the Redis of 'redis: enabled: true'); pass --redis URL, or also -c the file "
                        "that holds the redis section (every -c file the processes run with)")
        if not cfg.redis_enabled or not cfg.redis_url:
            return fail(f"{cfg.source}: redis is not enabled (redis: enabled: true), so Synapse's processes do not "
                        "replicate over Redis there; pass --redis URL, or the config files every process runs with")
        redis_url = cfg.redis_url
    if not server_name:
        if cfg is None:
            return fail("no channel: pass --server-name HS (the server_name of homeserver.yaml), or --config")
        if not cfg.server_name:
            return fail(f"{cfg.source}: no server_name; pass --server-name HS (the server_name Synapse runs with)")
        server_name = cfg.server_name
    if any(c in server_name for c in " \r\n"):
        where = "--server-name" if args.server_name else f"{cfg.source if cfg else 'the config'}: server_name"
        return fail(f"{where} {server_name!r}: a server name has no spaces or line breaks")
    if cfg is not None and args.no_replicate:
        print("factstream synapse watch: note: with --no-replicate, configured writers that stay quiet are not "
              "reported (an idle writer says nothing unasked); writers the config does not name still are",
              file=sys.stderr)
    db_url, db_origin = args.db, None
    if cfg is not None and not args.db and not args.no_db:
        db_url, db_origin, refused = _config_database(cfg)
        if refused:
            return fail(refused)
    opts = WatchOptions(
        redis_url=redis_url, server_name=server_name, db_url=db_url, db_origin=db_origin, interval=args.interval,
        frozen_after=args.frozen_after, json_output=args.json, metrics_port=args.metrics_port,
        metrics_host=args.metrics_host, duration=args.duration, replicate=not args.no_replicate,
        configured=cfg.wire_writers() if cfg is not None else None,
        config_source=cfg.source if cfg is not None else None,
        redis_origin="the --redis URL" if args.redis else f"the redis section of {cfg.source if cfg else 'the config'}",
        db_timeout=dbtimeout.seconds(args.db_timeout),
    )
    try:
        return transport.run(lambda: watch(opts, sys.stdout))
    except (CheckError, dbtimeout.NoAnswer) as err:  # the database at the start: unreachable, silent, not Synapse's
        hint = " (or --no-db to watch the wire only)" if db_origin else ""
        return fail(f"{err}{hint}")
    except WatchError as err:
        return fail(str(err))
    except BrokenPipeError:
        raise  # stdout closed (| head): the end the reader asked for, as every command takes it (cli.main)
    except OSError as err:
        return fail(f"{err.strerror or err}")
    except ValueError as err:  # a malformed Redis URL
        origin = "--redis URL" if args.redis else f"Redis URL built from the redis section of {cfg.source if cfg else ''}"
        return fail(f"bad {origin}: {err}")


#: What the watch cannot judge without a database, for the notes that say it runs without one.
_DB_CHECKS = "frozen, unpublished, sequence_behind_wire, position_ahead and db lag"


def _config_database(cfg: Any) -> tuple[str | None, str | None, str | None]:
    """(URL, origin, refusal) of the database ``watch --config`` takes when no --db is given.

    Synapse's PostgreSQL database, as Synapse connects to it. A config that
    names no database, or a SQLite one (a single process: no workers to
    fall behind), leaves the database checks out, saying so on stderr. A
    database section Synapse itself refuses is a refusal (exit 2).
    """
    db = cfg.database
    if db.engine == "sqlite" and db.url:
        path = db.url[len("sqlite:///"):]
        print(f"factstream synapse watch: note: {db.source} names a SQLite database ({path}); a SQLite Synapse is "
              f"one process, and the database checks ({_DB_CHECKS}) need PostgreSQL: watching the wire only",
              file=sys.stderr)
        return None, None, None
    if db.url:
        from ..synapse.snapshot import url_problem

        problem = url_problem(db.url)
        if problem:
            return None, None, f"{db.origin}: {problem}; fix it, or pass --db URL (or --no-db)"
        return db.url, db.origin, None
    if db.source is None:  # no database section at all: a split config given without its database file
        print(f"factstream synapse watch: note: {cfg.source} has no database section: the database checks "
              f"({_DB_CHECKS}) do not run; pass --db URL, or also -c the file that holds it", file=sys.stderr)
        return None, None, None
    return None, None, f"{db.error} (or --no-db to watch the wire only)"


def _scheme(url: str) -> str:
    """The lower-case scheme of a database URL without its driver (``postgresql+psycopg`` -> ``postgresql``)."""
    head, sep, _ = url.partition("://")
    return head.split("+")[0].lower() if sep else ""
