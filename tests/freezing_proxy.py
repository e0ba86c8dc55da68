"""A TCP proxy to PostgreSQL that goes silent at a query: a server that froze, for timeout tests."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class _Proxy:
    """Listens on 127.0.0.1 (``.port``) and links each client to ``upstream`` through :meth:`_link`."""

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, dsn: str) -> str:
        """``dsn`` (a pg_dsn of conftest's) through this proxy, without TLS."""
        host_port = dsn.split("@", 1)[1].split("/", 1)[0]
        return dsn.replace(host_port, f"127.0.0.1:{self.port}", 1) + "?sslmode=disable"

    def _silent(self) -> bool:
        """Whether a new connection is held unanswered (a cancel request, a reconnect) rather than linked."""
        raise NotImplementedError

    def _link(self, client: socket.socket, server: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.held.append(client)
            if self._silent():
                continue
            server = socket.create_connection(self.upstream)
            self.held.append(server)
            self._link(client, server)

    def close(self) -> None:
        self.listener.close()
        for s in self.held:
            s.close()


class FreezingProxy(_Proxy):
    """A TCP proxy to PostgreSQL that forwards the connect, then goes silent at the first query.

    From the client's first Query or Parse message on, nothing is forwarded
    either way and new connections (a cancel request) are accepted and never
    answered: what a client sees of a server that froze under its query. It
    parses the protocol, so the client must not use TLS (``sslmode=disable``).
    ``armed=False``: queries pass until :meth:`arm` (a server that freezes
    later, under a session already in use).
    """

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432), armed: bool = True) -> None:
        self.frozen = threading.Event()
        self.armed = threading.Event()
        if armed:
            self.armed.set()
        super().__init__(upstream)

    def _silent(self) -> bool:
        return self.frozen.is_set()

    def _link(self, client: socket.socket, server: socket.socket) -> None:
        threading.Thread(target=self._to_server, args=(client, server), daemon=True).start()
        threading.Thread(target=self._to_client, args=(server, client), daemon=True).start()

    def _to_server(self, client: socket.socket, server: socket.socket) -> None:
        buf, started = b"", False
        with contextlib.suppress(OSError):
            while (data := client.recv(65536)) and not self.frozen.is_set():
                buf += data
                while True:
                    if not started:  # the startup message: a length, no type byte
                        if len(buf) < 4 or len(buf) < (n := struct.unpack("!I", buf[:4])[0]):
                            break
                        started = True
                    else:
                        if len(buf) < 5:
                            break
                        if buf[:1] in (b"Q", b"P") and self.armed.is_set():  # a query: the server "freezes" now
                            self.frozen.set()
                            return
                        if len(buf) < (n := struct.unpack("!I", buf[1:5])[0] + 1):
                            break
                    server.sendall(buf[:n])
                    buf = buf[n:]

    def _to_client(self, server: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while (data := server.recv(65536)) and not self.frozen.is_set():
                client.sendall(data)

    def arm(self) -> None:
        """Freeze at the next query of any connection."""
        self.armed.set()


class StallingProxy(_Proxy):
    """A TCP proxy to PostgreSQL that stops forwarding anything on :meth:`stall`, until :meth:`resume`.

    While stalled, what either side sends is swallowed and new connections are
    accepted and never answered (a cancel request, a reconnect): a server that
    froze. On resume, the connections made meanwhile stay dead (their clients
    give up by their own timeouts) and new ones are forwarded. (FreezingProxy
    freezes for good: a client must be seen to recover here.)
    """

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.stalled = threading.Event()
        self.accepted_while_stalled = 0
        super().__init__(upstream)

    def stall(self) -> None:
        self.stalled.set()

    def resume(self) -> None:
        self.stalled.clear()

    def _silent(self) -> bool:
        if self.stalled.is_set():
            self.accepted_while_stalled += 1
            return True
        return False

    def _link(self, client: socket.socket, server: socket.socket) -> None:
        threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not self.stalled.is_set():
                    sink.sendall(data)
