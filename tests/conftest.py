"""Shared fixtures: implementation twins and real services.

Every codec and heap test takes an implementation fixture parametrised over
the compiled (``c``) and the pure-Python (``py``) twin. Service fixtures use
the real PostgreSQL and Redis on 127.0.0.1. Every external need (a Python
module, an executable, a service) goes through :func:`require`: when it is
missing the test is skipped with the reason and how to get it, except under
``CI=true``, where it fails.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any, NoReturn, overload

import pytest

from factstream import _compat

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

IMPL_PARAMS = [pytest.param("c", marks=pytest.mark.c, id="c"), pytest.param("py", id="py")]


def twin(module: str, impl: str) -> ModuleType:
    """The ``impl`` twin of ``module`` (e.g. "_wire"), failing loudly if the compiled one is missing."""
    if impl == "c" and _compat.REQUESTED_IMPL == "python":
        # A deliberate choice (a pure-Python run), not a missing prerequisite: CI sets neither switch.
        pytest.skip("FACTSTREAM_IMPL=python or FACTSTREAM_NO_EXTENSIONS is set: the compiled core is switched off")
    portable = os.environ.get("FACTSTREAM_TEST_WIRE_C")
    if impl == "c" and module == "_wire" and portable:
        # tests/test_wire_portable.py: the codec's tests against a build made with FACTSTREAM_NO_SIMD=1.
        spec = importlib.util.spec_from_file_location("factstream._wire_c", portable)
        assert spec is not None and spec.loader is not None, portable
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod._SIMD is False, f"{portable} was built with SIMD scanning"
        return mod
    try:
        return _compat.load(module, impl)
    except ImportError as err:
        pytest.fail(f"compiled twin of {module} expected but not importable ({err}); run 'make install'")


@pytest.fixture(params=IMPL_PARAMS, scope="session")
def impl(request: pytest.FixtureRequest) -> str:
    """Implementation name, "c" or "py"."""
    return str(request.param)


@pytest.fixture(scope="session")
def wire_impl(impl: str) -> ModuleType:
    """The wire codec twin under test (``parse_line``, ``encode``, ``encode_lines``, ``LineDecoder``)."""
    return twin("_wire", impl)


# ------------------------------------------------------------ external needs


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``; under CI=true fail with it instead, since CI must run every test."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing prerequisite is a failure, not a skip)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@overload
def require(*, module: str, how: str) -> ModuleType: ...
@overload
def require(*, binary: str, how: str) -> str: ...
@overload
def require(*, service: str, at: tuple[str, int], how: str) -> None: ...


def require(
    *, module: str | None = None, binary: str | None = None, service: str | None = None,
    at: tuple[str, int] | None = None, how: str,
) -> Any:
    """What a test needs from outside the package, or skip saying why and ``how`` to get it (fail under CI=true).

    Exactly one of: ``module`` (returned imported; a module that is present but
    fails to import is a failure everywhere, not a skip), ``binary`` (its path
    on PATH is returned) or ``service`` (a name, listening ``at`` (host, port)).
    """
    if sum(x is not None for x in (module, binary, service)) != 1:
        raise TypeError("require() takes exactly one of module=, binary=, service=")
    if module is not None:
        if importlib.util.find_spec(module) is None:
            unavailable(f"Python module {module!r} is not installed in {sys.executable}; {how}")
        return importlib.import_module(module)
    if binary is not None:
        path = shutil.which(binary)
        if path is None:
            unavailable(f"{binary!r} is not on PATH; {how}")
        return path
    assert service is not None and at is not None, "service= needs at=(host, port)"
    if not _reachable(*at):
        unavailable(f"{service} is not reachable at {at[0]}:{at[1]}; start it with: {how}")
    return None


def require_service(name: str, host: str, port: int, how_to_start: str) -> None:
    """Skip (or, under CI=true, fail) when a service is not listening (``require(service=...)``)."""
    require(service=name, at=(host, port), how=how_to_start)


PG_HOST = os.environ.get("FACTSTREAM_TEST_PGHOST", "127.0.0.1")
PG_PORT = int(os.environ.get("FACTSTREAM_TEST_PGPORT", "5432"))
PG_USER = os.environ.get("FACTSTREAM_TEST_PGUSER", "postgres")
PG_START = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
REDIS_HOST = os.environ.get("FACTSTREAM_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("FACTSTREAM_TEST_REDIS_PORT", "6379"))
REDIS_START = "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no"


def pg_dsn(dbname: str) -> str:
    return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{dbname}"


@pytest.fixture
def postgres_dsn() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    require_service("PostgreSQL", PG_HOST, PG_PORT, PG_START)
    import psycopg

    name = f"factstream_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_dsn(name)
    finally:
        with psycopg.connect(pg_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def redis_url() -> str:
    """URL of the real Redis server (skips or fails if it is down)."""
    require_service("Redis", REDIS_HOST, REDIS_PORT, REDIS_START)
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


@pytest.fixture
def channel_prefix() -> str:
    """A Redis channel name unique to one test, so tests never hear each other."""
    return f"factstream-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never says a word (a firewall, the wrong service)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(50)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        done.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(certificate, key) files of a self-signed certificate for localhost and 127.0.0.1, made by openssl."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


def terminate(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM ``proc`` if it still runs, SIGKILL it if it has not exited ``timeout`` s later; close its pipes."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@pytest.fixture(scope="session")
def heap_impl(impl: str) -> ModuleType:
    """The pending-completion heap twin under test (``PendingHeap``)."""
    return twin("ids._heap", impl)


@pytest.fixture(scope="session")
def relay_impl(impl: str) -> ModuleType:
    """The replication relay twin under test (``RowWindow``, ``StreamEmitter``, ``gather``, ``tally``)."""
    return twin("replication._relay", impl)


# --------------------------------------------------------------- event loops


def _new_uvloop() -> object:
    import uvloop

    return uvloop.new_event_loop()


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, object]:
    """Event loops for async tests: stdlib asyncio, plus uvloop in opted-in modules.

    A test module that sets ``BOTH_EVENT_LOOPS = True`` (transport tests) runs
    each async test twice, ids ``[asyncio]`` and ``[uvloop]``; every other
    async test runs once on the stdlib loop (hidden id), as before.
    """
    import asyncio

    module = getattr(item, "module", None)
    if getattr(module, "BOTH_EVENT_LOOPS", False):
        return {"asyncio": asyncio.new_event_loop, "uvloop": _new_uvloop}
    return {"asyncio": asyncio.new_event_loop}


# ------------------------------------------------------------------ Synapse oracle

SYNAPSE_PYTHON = os.environ.get("FACTSTREAM_SYNAPSE_PYTHON") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-synapse", "bin", "python"
)


def synapse_python() -> str:
    """The Python of the test-only Synapse install (``make oracle``); skips, or fails under CI, without it."""
    if os.path.exists(SYNAPSE_PYTHON):
        return SYNAPSE_PYTHON
    unavailable(f"Synapse oracle not installed at {SYNAPSE_PYTHON}: run 'make oracle' (a venv with matrix-synapse)")


class SynapseBridge:
    """A long-lived bridge script under the Synapse oracle's Python: one JSON line in, one out."""

    def __init__(self, script: str) -> None:
        import subprocess

        self.script = script
        self.proc = subprocess.Popen(
            [synapse_python(), script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
            encoding="utf-8", errors="surrogatepass",
        )

    def ask(self, request: dict[str, object]) -> dict[str, Any]:
        import json

        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"the Synapse bridge exited; run {self.script} under {SYNAPSE_PYTHON} to see why")
        result: dict[str, Any] = json.loads(reply)
        return result

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python that must import the same factstream as this test process."""
    import factstream

    here = os.path.dirname(os.path.dirname(os.path.abspath(factstream.__file__)))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([here, *rest]), **extra}


ENGINES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=ENGINES)
async def engine_db(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """An empty database of each engine: a SQLite file in tmp_path, or a throw-away PostgreSQL database."""
    from factstream.store.database import connect

    url = f"sqlite:///{tmp_path / 'test.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_dsn")
    database = await connect(url)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture(name="store")
async def event_store(engine_db: Any) -> AsyncIterator[Any]:
    """An :class:`~factstream.events.EventStore` opened on each engine's empty database (``engine_db``), closed after."""
    from factstream.events import EventStore

    s = await EventStore.open(engine_db)
    try:
        yield s
    finally:
        await s.close()


#: Seconds a test marked ``slow`` (a Spark cluster, a real Synapse) may take before it counts as hung.
SLOW_TIMEOUT = 1800


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests get a longer hang timeout than pyproject's default, unless they set their own."""
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
