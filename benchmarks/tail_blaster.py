"""A replication listener that answers REPLICATE with N pre-encoded RDATA lines as fast as the socket takes them.

Used by bench_cli_tail.py to measure ``factstream tail`` alone: the writer side costs nothing.
Usage: python tail_blaster.py N  (prints the port, serves one connection at a time until killed).
"""

from __future__ import annotations

import socket
import sys


def lines(n: int) -> bytes:
    """n rows in the shape `serve --produce` writes: three streams, one fact in eight a 3-row batch."""
    out = []
    token = 1
    i = 0
    while i < n:
        kind = token % 3
        if kind == 0:
            row = f'["get_user_by_id",["@user{token}_0:demo.hs"],{1795518094434 + token}]'
            stream = "caches"
        elif kind == 1:
            row = f'["!room{token % 13}:demo.hs","m.read","@user{token % 31}:demo.hs","$ev{token}_0",null,{{"ts":1795518095.4847922}}]'
            stream = "receipts"
        else:
            row = f'["@user{token % 97}:demo.hs"]'
            stream = "to_device"
        if token % 8 == 0 and i + 3 <= n:
            out.append(f"RDATA {stream} master batch {row}\nRDATA {stream} master batch {row}\nRDATA {stream} master {token} {row}\n")
            i += 3
        else:
            out.append(f"RDATA {stream} master {token} {row}\n")
            i += 1
        token += 1
    return "".join(out).encode()


def main() -> None:
    n = int(sys.argv[1])
    payload = lines(n)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    print(srv.getsockname()[1], flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(b"SERVER blaster\nPING 1\n")
            got = b""
            while b"REPLICATE" not in got:
                data = conn.recv(4096)
                if not data:
                    break
                got += data
            try:
                conn.sendall(payload)
                while conn.recv(65536):  # until the reader hangs up
                    pass
            except OSError:
                pass


if __name__ == "__main__":
    main()
