"""``factstream demo``: live replication on the embedded default, verified.

One writer process (``factstream serve --produce`` on a SQLite file) writes
facts on three streams as fast as it can, rolling back a share of its
transactions; two reader processes follow it over TCP on 127.0.0.1, each
appending what it receives to its own log. Midway one reader is killed with
SIGKILL and restarted: it resumes from its log and catches up from the
database. Each process gets a progress bar. At the end the demo checks that
every reader received every committed fact exactly once and in order (holes
from rollbacks skipped) and prints throughput and lag; the exit status is 1
if the check fails. With ``--redis URL`` the writer and readers replicate
over Redis pub/sub instead of TCP (on a channel unique to the run), with
``--nats [URL]`` over NATS JetStream (a stream unique to the run, deleted at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from .. import transport
from ..demo.live import Child, committed_facts, reader_main, verify_log
from .argtypes import duration, fraction, port, whole_number


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the live replication demo (writer + two readers, one killed midway) and verify it",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--duration", type=duration(), default=12.0, help="seconds the writer produces (default 12)")
    p.add_argument("--readers", type=whole_number(1), default=2, help="reader processes (default 2)")
    p.add_argument("--no-kill", action="store_true", help="do not kill and restart a reader")
    p.add_argument("--rollback-rate", type=fraction, default=0.1, help="share of writer transactions rolled back")
    p.add_argument("--workdir", help="keep the database and logs here (default: a temporary directory, removed)")
    p.add_argument("--json", action="store_true", help="print the final report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--redis", metavar="URL", help="replicate over Redis pub/sub at URL instead of TCP (e.g. redis://127.0.0.1:6379)")
    p.add_argument("--nats", metavar="URL", nargs="?", const="nats://127.0.0.1:4222",
                   help="replicate over NATS JetStream at URL (default nats://127.0.0.1:4222) instead of TCP; "
                        "the run's stream is deleted at the end")
    p.add_argument("--server-name", default="",
                   help="server name (with --redis: the channel; default demo.hs over TCP, "
                        "a fresh name per run over Redis or NATS)")
    # Internal: the reader processes run this same command.
    p.add_argument("--role", choices=("orchestrator", "reader"), default="orchestrator", help=argparse.SUPPRESS)
    p.add_argument("--name", default="reader1", help=argparse.SUPPRESS)
    p.add_argument("--port", type=port, default=0, help=argparse.SUPPRESS)
    p.add_argument("--db", default="", help=argparse.SUPPRESS)
    p.add_argument("--log", default="", help=argparse.SUPPRESS)
    p.add_argument("--final", default="", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.role == "reader":
        return transport.run(lambda: reader_main(args))
    return transport.run(lambda: orchestrate(args), use_uvloop=False)



async def orchestrate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.redis:
        from .link import check_redis

        await check_redis(args.redis, args.server_name or "demo.hs", "factstream demo")
    if args.nats:
        from .link import check_nats

        await check_nats(args.nats, args.server_name or "demo.hs", "factstream demo")
    workdir = args.workdir or tempfile.mkdtemp(prefix="factstream-demo-")
    os.makedirs(workdir, exist_ok=True)
    db_path = os.path.join(workdir, "demo.db")
    for leftover in ("demo.db", "demo.db-wal", "demo.db-shm", "final.json"):
        if os.path.exists(os.path.join(workdir, leftover)):
            os.remove(os.path.join(workdir, leftover))
    db_url = f"sqlite:///{db_path}"
    final_path = os.path.join(workdir, "final.json")
    py = [sys.executable, "-m", "factstream.cli"]
    show = not args.no_progress and not args.json
    say = (lambda msg: tqdm.write(msg, file=sys.stderr)) if show else (lambda msg: print(msg, file=sys.stderr))

    def bar(pos: int, desc: str, unit: str) -> Any:
        if not show:
            return None
        return tqdm(desc=desc.ljust(18), position=pos, unit=unit, unit_scale=True, leave=True, dynamic_ncols=True, file=sys.stderr)

    server_name = args.server_name or "demo.hs"
    carrier = ["--port", "0"]
    where = "TCP on 127.0.0.1"
    if args.redis:
        from ..transport.redis import redacted_url

        # Channels are global to a Redis server: a fresh name keeps concurrent demos apart.
        server_name = args.server_name or f"factstream-demo-{os.urandom(4).hex()}"
        carrier = ["--redis", args.redis]
        where = f"Redis {redacted_url(args.redis)} (channel {server_name})"
    if args.nats:
        from ..redaction import redact_url

        # One JetStream stream per deployment: a fresh name keeps concurrent demos apart.
        server_name = args.server_name or f"factstream-demo-{os.urandom(4).hex()}"
        carrier = ["--nats", args.nats]
        where = f"NATS JetStream {redact_url(args.nats)} (server name {server_name})"
    say(f"factstream demo: writer + {args.readers} readers over {where}, SQLite at {db_path}")
    writer = Child("writer", [*py, "serve", "--db", db_url, *carrier, "--produce", "--duration", str(args.duration),
                              "--status", "--seed", str(args.seed), "--server-name", server_name,
                              "--rollback-rate", str(args.rollback_rate)], workdir, bar(0, "writer (rows)", "row"))
    readers: list[Child] = []
    started = time.monotonic()
    result = 1
    interrupted = False
    try:
        await writer.start()
        port = (await writer.wait("listening", 30))["port"]
        if args.redis:
            carrier = ["--redis", args.redis, "--server-name", server_name]
        elif args.nats:
            carrier = ["--nats", args.nats, "--server-name", server_name]
        else:
            carrier = ["--port", str(port), "--server-name", server_name]
        for i in range(args.readers):
            name = f"reader{i + 1}"
            log_path = os.path.join(workdir, f"{name}.log")
            if os.path.exists(log_path):
                os.remove(log_path)
            child = Child(name, [*py, "demo", "--role", "reader", "--name", name, *carrier, "--db", db_url,
                                 "--log", log_path, "--final", final_path], workdir, bar(i + 1, f"{name} (rows)", "row"))
            await child.start()
            await child.wait("started", 30)
            readers.append(child)

        produced_fut = writer.event("produced")
        victim = readers[-1] if readers and not args.no_kill else None
        if victim is not None:
            await asyncio.sleep(args.duration * 0.4)
            await victim.kill()
            say(f"killed {victim.name} (SIGKILL) at {time.monotonic() - started:.1f}s; restarting it in 1s")
            if victim.bar is not None:
                victim.bar.set_description(f"{victim.name} (killed)".ljust(18))
            await asyncio.sleep(1.0)
            await victim.start()
            victim.restarts += 1
            restarted = await victim.wait("started", 30)
            if victim.bar is not None:
                victim.bar.set_description(f"{victim.name} (restarted)".ljust(18))
            say(f"restarted {victim.name}: resumed after {restarted['recovered_rows']} rows from its log")
        produced = await writer.wait("produced", args.duration + 60)
        with open(final_path + ".tmp", "w") as fh:
            json.dump(produced["positions"], fh)
        os.replace(final_path + ".tmp", final_path)
        for writer_total_bar in [r.bar for r in readers if r.bar is not None]:
            writer_total_bar.total = produced["rows"]
        dones = [await r.wait("done", 90) for r in readers]
        for r in [writer, *readers]:
            if r.bar is not None:
                r.bar.close()
        await writer.terminate()
        _ = produced_fut

        truth = committed_facts(db_path)
        reports = [verify_log(os.path.join(workdir, f"{r.name}.log"), truth) for r in readers]
        ok = all(rep["ok"] for rep in reports)
        total_facts = sum(len(f) for f in truth.values())
        total_rows = sum(len(rows) for f in truth.values() for rows in f.values())
        summary = {
            "ok": ok,
            "seconds": round(time.monotonic() - started, 1),
            "writer": {
                "facts": total_facts,
                "rows": total_rows,
                "rolled_back_ids": produced["rolled_back"],
                "facts_per_s": round(produced["facts"] / produced["seconds"]),
                "rows_per_s": round(produced["rows"] / produced["seconds"]),
                "positions": produced["positions"],
            },
            "readers": [
                {"name": r.name, "restarts": r.restarts, **{k: v for k, v in d.items() if k != "event"}, "verification": rep}
                for r, d, rep in zip(readers, dones, reports)
            ],
            "workdir": workdir if args.workdir else None,
        }
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print_summary(summary)
        result = 0 if ok else 1
    except Exception as err:  # report, clean up, fail
        print(f"factstream demo: FAILED: {err}", file=sys.stderr)
        result = 1
    except asyncio.CancelledError:  # Ctrl-C: stop the children, leave nothing behind, exit 130
        interrupted = True
        raise
    finally:
        for r in readers:
            await r.terminate(2)
        await writer.terminate(5)
        if args.nats:
            await drop_nats_stream(args.nats, server_name)
        if not args.workdir and (result == 0 or interrupted):
            shutil.rmtree(workdir, ignore_errors=True)
        elif interrupted:
            pass
        elif result != 0:
            print(f"factstream demo: logs kept in {workdir}", file=sys.stderr)
    return result


async def drop_nats_stream(url: str, server_name: str) -> None:
    """Delete the run's JetStream stream (a log outlives its processes, unlike a pub/sub channel)."""
    from ..transport.nats import delete_stream

    try:
        await delete_stream(url, server_name)
    except Exception as err:  # noqa: BLE001 - cleanup only: say so, keep the verdict
        print(f"factstream demo: could not delete the run's JetStream stream: {err}", file=sys.stderr)


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}{unit}"
    return f"{v:,}{unit}"


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def _caught_up(r: dict[str, Any]) -> str:
    """How a reader got what it missed, as its figures say (a NATS reader replays the log, not the database)."""
    if r["catchup_rows"]:
        return f"caught up from the database ({r['catchup_rows']:,} rows)"
    if r.get("carrier", "tcp") == "nats":
        return "replayed what it missed from the JetStream log (nothing from the database)"
    return "missed nothing it had to fetch from the database"


def print_summary(s: dict[str, Any]) -> None:
    w = s["writer"]
    print()
    print(f"writer: {w['facts']:,} committed facts ({w['rows']:,} rows) on {len(w['positions'])} streams, "
          f"{w['rolled_back_ids']:,} ids rolled back (holes); {w['facts_per_s']:,} facts/s, {w['rows_per_s']:,} rows/s")
    print(f"{'reader':<10} {'rows':>9} {'rows/s':>9} {'lag p50':>9} {'lag p99':>9} {'connects':>8} {'caught up':>10}  verification")
    for r in s["readers"]:
        v = r["verification"]
        lost = sum(x["lost"] for x in v["streams"].values())
        dup = sum(x["duplicated"] for x in v["streams"].values())
        reord = sum(x["reordered"] for x in v["streams"].values())
        verdict = "OK" if v["ok"] else "FAILED"
        name = r["name"] + (" *" if r["restarts"] else "")
        print(f"{name:<10} {r['rows']:>9,} {_fmt(r['rows_per_s']):>9} {_fmt(r['lag_p50_ms'], 'ms'):>9} "
              f"{_fmt(r['lag_p99_ms'], 'ms'):>9} {r['connects']:>8} {r['catchup_rows']:>10,}  "
              f"{verdict}: lost {lost}, duplicated {dup}, reordered {reord}")
    for r in s["readers"]:
        if r["restarts"]:
            print(f"* killed with SIGKILL midway and restarted; it resumed from its own log and {_caught_up(r)}")
    for r in s["readers"]:
        said = r.get("writer_closes", 0)
        ends = max(r.get("connection_ends", 0), said)
        if ends and r.get("carrier", "tcp") != "tcp":
            # Redis and NATS tell a client nothing of why (Redis cuts a subscriber that falls behind its
            # output-buffer limit, for one)
            where = "NATS" if r["carrier"] == "nats" else "Redis"
            print(f"{r['name']}: its connection to {where} ended {_times(ends)}; it reconnected and {_caught_up(r)}")
        elif ends:
            why = [f"the writer said: {'; '.join(r['writer_errors'])}"] if said else []
            if ends > said:
                why.append(f"{_times(ends - said)} without a word from the writer")
            print(f"{r['name']}: its connection ended {_times(ends)} ({'; '.join(why)}); it reconnected and "
                  f"{_caught_up(r)}")
    print(f"\n{'PASS' if s['ok'] else 'FAIL'}: every reader received every committed fact exactly once and in order"
          if s["ok"] else "\nFAIL: see the verification column")
    print(f"({s['seconds']}s in all)")
