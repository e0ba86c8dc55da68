"""Times Synapse's own codec on a corpus (run under the Synapse oracle venv).

Usage: .venv-synapse/bin/python benchmarks/synapse_speed.py CORPUS_FILE
Prints JSON: best-of-5 seconds to parse every line (Synapse decodes rows
eagerly) and to write every parsed command as a TCP line.
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


def main(path: str) -> None:
    with open(path, "rb") as fh:
        data = fh.read()
    lines = [line for line in data.split(b"\n") if line]

    def decode() -> None:
        # Synapse's TCP protocol: split lines, decode UTF-8, parse; the reader then drops each command.
        for line in data.split(b"\n"):
            if line:
                parse_command_from_line(line.decode("utf-8"))

    cmds = [parse_command_from_line(line.decode("utf-8")) for line in lines]

    def encode() -> bytes:
        return b"".join([("%s %s\n" % (c.NAME, c.to_line())).encode("utf-8") for c in cmds])

    assert encode() == data
    print(json.dumps({"lines": len(lines), "decode_s": best(decode), "encode_s": best(encode)}))


if __name__ == "__main__":
    main(sys.argv[1])
