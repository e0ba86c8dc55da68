"""A real Synapse deployment for tests: main process + one generic worker, on PostgreSQL and Redis.

The worker (``worker1``) is a second receipts writer, so the receipts stream
has two writers on the wire; the main process serves the client API the test
drives (register, create a room, send messages and read receipts). Each
deployment gets a unique server_name, hence its own Redis channel.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from conftest import PG_HOST, PG_PORT, PG_USER, REDIS_HOST, REDIS_PORT, synapse_python

SHARED_SECRET = "factstream-test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SynapseDeployment:
    """Start with :meth:`start`, drive with :meth:`register` / :meth:`api`, end with :meth:`stop`."""

    def __init__(self, directory: Path, dbname: str) -> None:
        self.dir = directory
        self.dbname = dbname
        self.server_name = f"w{uuid.uuid4().hex[:10]}.test"
        self.http = free_port()
        self.repl_main = free_port()
        self.repl_worker = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _write_configs(self) -> tuple[Path, Path, Path]:
        self.dir.mkdir(parents=True, exist_ok=True)
        key = self.dir / "signing.key"
        subprocess.run(
            [synapse_python(), "-c",
             "import sys; from signedjson.key import generate_signing_key, write_signing_keys; "
             "write_signing_keys(open(sys.argv[1], 'w'), [generate_signing_key('w')])", str(key)],
            check=True, timeout=60)
        limit = {"per_second": 10000, "burst_count": 10000}
        shared = {
            "server_name": self.server_name,
            "report_stats": False,
            "signing_key_path": str(key),
            "media_store_path": str(self.dir / "media"),
            "suppress_key_server_warning": True,
            "trusted_key_servers": [],
            "registration_shared_secret": SHARED_SECRET,
            "database": {"name": "psycopg2", "args": {
                "user": PG_USER, "host": PG_HOST, "port": PG_PORT, "dbname": self.dbname, "cp_min": 1, "cp_max": 5}},
            "redis": {"enabled": True, "host": REDIS_HOST, "port": REDIS_PORT},
            "instance_map": {
                "main": {"host": "127.0.0.1", "port": self.repl_main},
                "worker1": {"host": "127.0.0.1", "port": self.repl_worker},
            },
            "stream_writers": {"receipts": ["master", "worker1"]},
            "rc_message": limit, "rc_registration": limit, "rc_login": {"address": limit, "account": limit,
                                                                        "failed_attempts": limit},
            "rc_joins": {"local": limit, "remote": limit},
        }
        main = {"listeners": [
            {"port": self.http, "bind_addresses": ["127.0.0.1"], "type": "http", "x_forwarded": False,
             "resources": [{"names": ["client"], "compress": False}]},
            {"port": self.repl_main, "bind_addresses": ["127.0.0.1"], "type": "http",
             "resources": [{"names": ["replication"]}]},
        ]}
        worker = {
            "worker_app": "synapse.app.generic_worker",
            "worker_name": "worker1",
            "worker_listeners": [{"type": "http", "port": self.repl_worker, "bind_addresses": ["127.0.0.1"],
                                  "resources": [{"names": ["replication"]}]}],
        }
        paths = []
        for name, cfg in (("shared", shared), ("main", main), ("worker1", worker)):
            p = self.dir / f"{name}.json"
            p.write_text(json.dumps(cfg, indent=1))
            paths.append(p)
        return paths[0], paths[1], paths[2]

    def start(self, timeout: float = 240) -> None:
        shared, main, worker = self._write_configs()
        # The main process prepares the schema; a worker refuses an uninitialised database.
        for name, module, extra, health in (
            ("main", "synapse.app.homeserver", main, self.http),
            ("worker1", "synapse.app.generic_worker", worker, self.repl_worker),
        ):
            log = open(self.dir / f"{name}.log", "wb")
            self.procs[name] = subprocess.Popen(
                [synapse_python(), "-m", module, "--config-path", str(shared), "--config-path", str(extra)],
                stdout=log, stderr=subprocess.STDOUT, cwd=str(self.dir))
            log.close()
            self._wait(f"http://127.0.0.1:{health}/health", name, timeout)

    def _wait(self, url: str, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"Synapse {name} exited: {self.log(name)[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"Synapse {name} did not become healthy in {timeout}s: {self.log(name)[-3000:]}")

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def pause(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGCONT)

    # ------------------------------------------------------------------ client API

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"{}")

    def register(self, user: str, password: str = "pw-" + uuid.uuid4().hex) -> str:
        nonce = self.api("GET", "/_synapse/admin/v1/register")["nonce"]
        mac = hmac.new(SHARED_SECRET.encode(), b"\x00".join([nonce.encode(), user.encode(), password.encode(),
                                                               b"notadmin"]), hashlib.sha1).hexdigest()
        reply = self.api("POST", "/_synapse/admin/v1/register",
                         {"nonce": nonce, "username": user, "password": password, "mac": mac, "admin": False})
        return str(reply["access_token"])

    def create_room(self, token: str) -> str:
        return str(self.api("POST", "/_matrix/client/v3/createRoom", {"preset": "private_chat"}, token)["room_id"])

    def send(self, token: str, room: str, text: str) -> str:
        txn = uuid.uuid4().hex
        path = f"/_matrix/client/v3/rooms/{urllib.parse.quote(room)}/send/m.room.message/{txn}"
        return str(self.api("PUT", path, {"msgtype": "m.text", "body": text}, token)["event_id"])

    def receipt(self, token: str, room: str, event_id: str) -> None:
        path = f"/_matrix/client/v3/rooms/{urllib.parse.quote(room)}/receipt/m.read/{urllib.parse.quote(event_id)}"
        self.api("POST", path, {}, token)
