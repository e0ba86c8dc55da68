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
import queue
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import PG_HOST, PG_PORT, PG_START, PG_USER, REDIS_HOST, REDIS_PORT, REDIS_START, require_service, synapse_python

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


@contextmanager
def running_deployment(directory: Path, prefix: str) -> Iterator[SynapseDeployment]:
    """A started deployment on a PostgreSQL database of its own (``prefix`` + a random part): stopped and the
    database dropped afterwards."""
    from synapse_fixtures import _create_db, _drop_db

    require_service("PostgreSQL", PG_HOST, PG_PORT, PG_START)
    require_service("Redis", REDIS_HOST, REDIS_PORT, REDIS_START)
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    _create_db(name)
    dep = SynapseDeployment(directory, name)
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()
        _drop_db(name)


class PrivateRedis:
    """A redis-server of a test's own on a free port (``password``: with requirepass): stopping it touches no one else."""

    def __init__(self, password: str | None = None) -> None:
        self.port = free_port()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", *auth], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.proc = None


class PrivatePostgres:
    """A PostgreSQL server of a test's own on a free port that checks passwords (scram-sha-256), in a temp dir.

    The shared server trusts every local connection, so a wrong password
    passes there; this one refuses it. Its superuser ``postgres`` has
    ``password`` (given through a file, never on a command line). Run as the
    ``postgres`` system user when the tests run as root (PostgreSQL refuses
    root). Stop it with :meth:`stop`, which stops only this server.
    """

    def __init__(self, password: str) -> None:
        import glob
        import pwd
        import shutil

        from conftest import unavailable

        self.password = password
        self.port = free_port()
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        initdb = shutil.which("initdb") or (found[-1] if found else None)
        if initdb is None:
            unavailable("initdb is not installed (apt-get install postgresql)")
        self.bindir = os.path.dirname(initdb)
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                unavailable("running as root and there is no 'postgres' user to run a private PostgreSQL as")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="factstream-pg-"))  # not under pytest's root-only tmp tree
        self.data = self.dir / "data"
        pwfile = self.dir / "pw"
        pwfile.write_text(password + "\n")
        if self.as_user:
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        os.chmod(pwfile, 0o600)
        subprocess.run([*self.as_user, initdb, "-D", str(self.data), "-U", "postgres", "--pwfile", str(pwfile),
                        "-A", "scram-sha-256", "--no-sync"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=120)
        pwfile.unlink()
        self.started = False

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run([*self.as_user, os.path.join(self.bindir, "pg_ctl"), "-D", str(self.data), "-l",
                        str(self.dir / "log"), "-o", opts, "-w", "-t", "60", "start"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=90)
        self.started = True

    def stop(self) -> None:
        import shutil

        if self.started:
            subprocess.run([*self.as_user, os.path.join(self.bindir, "pg_ctl"), "-D", str(self.data), "-m", "fast",
                            "-w", "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)


class Watch:
    """A running ``factstream synapse watch --json``: its reports as they come."""

    def __init__(self, *args: str) -> None:
        from cli_run import FACTSTREAM

        self.proc = subprocess.Popen([FACTSTREAM, "synapse", "watch", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.reports: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.reports.put(json.loads(line))

    def wait_for(self, what: str, ok: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                report = self.reports.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"watch exited: {self.proc.stderr.read() if self.proc.stderr else ''}"
                continue
            self.seen.append(report)
            if ok(report):
                return report
        raise AssertionError(f"no report with {what} in {timeout}s; last: {self.seen[-1:]}")

    def stop(self) -> str:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err
