"""Times Synapse's own codec on a corpus (run under the Synapse oracle venv).

Usage: .venv-synapse/bin/python benchmarks/synapse_speed.py CORPUS_FILE [REPEAT]
Prints JSON: best-of-REPEAT (5) seconds to decode a TCP buffer (Synapse
decodes rows eagerly), to parse every line on its own, and to write every
parsed command as a TCP line.

Or: synapse_speed.py CORPUS_FILE --passes OP N: run OP (decode, parse or
encode) N times, untimed, for an instruction count (benchmarks/callgrind.py).
"""

from __future__ import annotations

import json
import sys
import time

from synapse.replication.tcp.commands import parse_command_from_line


def best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(path: str, repeat: int = 5, passes: tuple[str, int] | None = None) -> None:
    with open(path, "rb") as fh:
        data = fh.read()
    lines = [line for line in data.split(b"\n") if line]

    def decode() -> None:
        # Synapse's TCP protocol: split lines, decode UTF-8, parse (rows are
        # decoded eagerly); the reader then drops each command.
        for line in data.split(b"\n"):
            if line:
                parse_command_from_line(line.decode("utf-8"))

    def parse() -> None:
        # One line at a time, as published on Redis.
        for line in lines:
            parse_command_from_line(line.decode("utf-8"))

    cmds = [parse_command_from_line(line.decode("utf-8")) for line in lines]

    def encode() -> bytes:
        return b"".join([("%s %s\n" % (c.NAME, c.to_line())).encode("utf-8") for c in cmds])

    assert encode() == data
    if passes is not None:
        op, n = passes
        for _ in range(n):
            {"decode": decode, "parse": parse, "encode": encode}[op]()
        return
    print(json.dumps({"lines": len(lines), "decode_s": best(decode, repeat), "parse_s": best(parse, repeat),
                      "encode_s": best(encode, repeat)}))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--passes":
        main(sys.argv[1], passes=(sys.argv[3], int(sys.argv[4])))
    else:
        main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
