"""No password reaches any output: every command that takes a database URL, run with one holding a password.

Against an unreachable server (nothing on port 1), a reachable server with a
missing database, and, for ``serve``, a working database (its banner and
``--status`` lines), through the installed ``factstream`` executable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

import pytest

from conftest import PG_HOST, PG_PORT, PG_USER, require_service, subprocess_env

FACTSTREAM = os.path.join(os.path.dirname(sys.executable), "factstream")
ENV = subprocess_env()
SECRET = "Pw-n0t-f0r-y0ur-eyes"

UNREACHABLE = f"postgresql://fsuser:{SECRET}@127.0.0.1:1/nodb"


def _missing_db() -> str:
    require_service("PostgreSQL", PG_HOST, PG_PORT, "see tests/conftest.py")
    return f"postgresql://{PG_USER}:{SECRET}@{PG_HOST}:{PG_PORT}/factstream_no_such_db"


def _commands(url: str, tmp: Any) -> dict[str, list[str]]:
    return {
        "serve": ["serve", "--db", url, "--port", "0"],
        "serve --status": ["serve", "--db", url, "--port", "0", "--status"],
        "serve --produce": ["serve", "--db", url, "--port", "0", "--produce", "--duration", "1"],
        "positions": ["positions", "--db", url],
        "positions --json": ["positions", "--db", url, "--json"],
        "tail --db": ["tail", "127.0.0.1:1", "--db", url, "--count", "1"],
        "demo reader": ["demo", "--role", "reader", "--name", "r1", "--db", url, "--log", str(tmp / "r1.log")],
        "events-demo": ["events-demo", "--db", url],
    }


@pytest.mark.parametrize("where", ["unreachable", pytest.param("missing", marks=pytest.mark.postgres)])
def test_no_command_prints_the_database_password(where: str, tmp_path: Any) -> None:
    url = UNREACHABLE if where == "unreachable" else _missing_db()
    for name, args in _commands(url, tmp_path).items():
        done = subprocess.run([FACTSTREAM, *args], capture_output=True, text=True, timeout=60, env=ENV)
        out = done.stdout + done.stderr
        assert SECRET not in out, f"{name} printed the password:\n{out}"
        assert done.returncode != 0, f"{name} exited 0 against an {where} database:\n{out}"
        assert "***" in out, f"{name} does not say which database failed:\n{out}"


@pytest.mark.postgres
def test_serve_banner_and_status_mask_the_password(postgres_dsn: str) -> None:
    parts = urlsplit(postgres_dsn)
    url = parts._replace(netloc=f"{parts.username}:{SECRET}@{parts.hostname}:{parts.port}").geturl()
    for extra in ([], ["--status"]):
        proc = subprocess.Popen(
            [FACTSTREAM, "serve", "--db", url, "--port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        )
        try:
            stream = proc.stdout if extra else proc.stderr
            assert stream is not None
            line = stream.readline()
            assert line, "serve printed nothing"
            if extra:
                assert json.loads(line)["event"] == "listening"
            else:
                assert "db postgresql://" in line and ":***@" in line, line
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
        assert SECRET not in line + out + err
        assert proc.returncode == 0, err


def test_serve_redis_url_password_is_masked() -> None:
    done = subprocess.run(
        [FACTSTREAM, "serve", "--db", "sqlite:///:memory:", "--redis", f"redis://:{SECRET}@127.0.0.1:1/0"],
        capture_output=True, text=True, timeout=60, env=ENV,
    )
    assert done.returncode != 0 and SECRET not in done.stdout + done.stderr
    assert "redis://:***@127.0.0.1:1" in done.stderr
