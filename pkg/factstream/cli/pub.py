"""``factstream pub``: send hand-written replication commands, validated by the codec first.

Over TCP it connects as a client (NAME, PING) and may only send what a
client may send (REPLICATE, USER_SYNC, FEDERATION_ACK, ...); it then waits a
moment for the server to object (ERROR). Onto a Redis deployment
(``--redis``) it publishes each command on the channel Synapse uses for it.
Every line is parsed by the codec before anything is sent: one bad line and
nothing goes out. On a Redis channel, RDATA and POSITION of streams Synapse
does not know are refused unless ``--custom-streams`` (Synapse processes on
that channel would stop on them).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from .. import transport, wire
from ..commands import CLIENT_COMMANDS, Command
from ..errors import ProtocolError
from ..redaction import redact_url
from .argtypes import duration
from .link import LinkError, check_redis, parse_target, refuse_tls_options
from .link import connect_within
from .tail import add_link_options, link_options

PROG = "factstream pub"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "pub",
        intermixed=True,  # commands may follow the options: pub HOST:PORT --server-name hs 'PING 1'
        help="send hand-written replication commands over TCP (as a client) or onto a Redis channel",
        description=(
            "Send replication commands given as arguments (one command per argument) or read from stdin (one per "
            "line; '-' or no COMMAND). Every line is validated by the codec before anything is sent. TCP "
            "(HOST:PORT): connect as a client; only commands a client may send. Redis (--redis URL --server-name "
            "NAME): publish on the deployment's channel (USER_IP on its own channel, as Synapse does); RDATA and "
            "POSITION of a stream that Synapse does not know are refused unless --custom-streams."
        ),
        epilog="example: factstream pub 127.0.0.1:9092 'USER_SYNC worker1 @alice:hs DEV start 1700000000000'",
    )
    p.add_argument("target", metavar="HOST:PORT", nargs="?", help="a TCP replication listener (not with --redis)")
    p.add_argument("commands", metavar="COMMAND", nargs="*", help="wire lines to send ('-' or none: read stdin)")
    p.add_argument("--redis", metavar="URL", help="publish onto a Redis deployment's channel (needs --server-name)")
    p.add_argument("--custom-streams", action="store_true",
                   help="with --redis: allow RDATA/POSITION of streams outside Synapse's stream registry")
    p.add_argument("--wait", type=duration("do not wait"), default=0.5,
                   help="TCP: seconds to wait for the server to answer ERROR after sending (default 0.5)")
    p.add_argument("--client-name", default="factstream-pub", help="name sent in NAME (TCP)")
    add_link_options(p)
    p.set_defaults(func=run)


def read_lines(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(where, line) of every command to send, from the arguments or stdin."""
    given = list(args.commands)
    if args.redis and args.target:  # with --redis the first positional is a command, not a target
        given.insert(0, args.target)
    if not given or given == ["-"]:
        return [(f"stdin line {i}", line.rstrip("\r\n")) for i, line in enumerate(sys.stdin, 1) if line.strip()]
    return [(f"argument {i}", line) for i, line in enumerate(given, 1)]


def validate(lines: list[tuple[str, str]], *, over_tcp: bool, custom_streams: bool) -> tuple[list[Command], list[str]]:
    """The parsed commands, and one message per line that may not be sent."""
    from ..streams.registry import SYNAPSE_STREAMS

    known = {d.name for d in SYNAPSE_STREAMS}
    cmds: list[Command] = []
    problems: list[str] = []
    for where, line in lines:
        try:
            cmd = wire.parse_line(line.encode("utf-8"))
        except ProtocolError as err:
            problems.append(f"{where}: {err}")
            continue
        except UnicodeEncodeError as err:
            problems.append(f"{where}: not encodable as UTF-8 ({err.reason})")
            continue
        if over_tcp and cmd.NAME not in CLIENT_COMMANDS:
            problems.append(f"{where}: {cmd.NAME} is not a command a client may send over TCP (pub connects as a "
                            f"client: {', '.join(sorted(CLIENT_COMMANDS))}); publish server commands with --redis")
            continue
        stream = getattr(cmd, "stream_name", None)
        if not over_tcp and stream is not None and stream not in known and not custom_streams:
            problems.append(f"{where}: stream {stream!r} is not one of Synapse's streams; Synapse processes on this "
                            "channel would fail on it (pass --custom-streams if only factstream readers listen)")
            continue
        cmds.append(cmd)
    return cmds, problems


async def pub_tcp(args: argparse.Namespace, cmds: list[Command]) -> int:
    opts = link_options(args, args.client_name, replicate=False)
    try:
        link = await connect_within(opts)
    except LinkError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    errors: list[str] = []
    try:
        link.send_lines([wire.encode(c) for c in cmds])
        await link.writer.drain()
        deadline = asyncio.get_running_loop().time() + args.wait
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                chunk = await asyncio.wait_for(link.read(), left)
            except TimeoutError:
                break
            except LinkError as err:
                errors.append(str(err))
                break
            errors.extend(line[6:].decode("utf-8", "replace") for line in chunk.split(b"\n")
                          if line.startswith(b"ERROR "))
    finally:
        await link.close()
    for e in errors:
        print(f"{PROG}: the server answered: {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"{PROG}: sent {len(cmds)} command(s) to {opts.target} ({link.server_name})", file=sys.stderr)
    return 0


async def pub_redis(args: argparse.Namespace, cmds: list[Command]) -> int:
    import redis.asyncio as aioredis

    from ..transport.redis import RedisChannels

    await check_redis(args.redis, args.server_name, PROG, args.connect_timeout)
    channels = RedisChannels.for_server(args.server_name)
    client = aioredis.from_url(args.redis)
    heard = 0
    try:
        async with client.pipeline(transaction=False) as pipe:
            for c in cmds:
                pipe.publish(channels.for_command(c.NAME), wire.encode(c))
            heard = sum(int(n) for n in await pipe.execute())
    finally:
        await client.aclose()
    print(f"{PROG}: published {len(cmds)} command(s) on {redact_url(args.redis)} channel {args.server_name} "
          f"({heard} deliveries to subscribers)", file=sys.stderr)
    return 0


async def pub(args: argparse.Namespace) -> int:
    if args.redis:
        if not args.server_name:
            print(f"{PROG}: --redis needs --server-name NAME (the deployment's channel)", file=sys.stderr)
            return 2
        refuse_tls_options(args, PROG)
    elif not args.target:
        print(f"{PROG}: say where to send: HOST:PORT (TCP, as a client) or --redis URL --server-name NAME",
              file=sys.stderr)
        return 2
    else:
        parse_target(args.target, PROG)
    lines = read_lines(args)
    if not lines:
        print(f"{PROG}: nothing to send (give commands as arguments or on stdin)", file=sys.stderr)
        return 2
    cmds, problems = validate(lines, over_tcp=not args.redis, custom_streams=args.custom_streams)
    if problems:
        for p in problems:
            print(f"{PROG}: {p}", file=sys.stderr)
        print(f"{PROG}: nothing sent ({len(problems)} of {len(lines)} line(s) refused)", file=sys.stderr)
        return 1
    return await (pub_redis(args, cmds) if args.redis else pub_tcp(args, cmds))


def run(args: argparse.Namespace) -> int:
    return transport.run(lambda: pub(args), use_uvloop=not args.no_uvloop)
