"""What a Synapse config file (homeserver.yaml) says about writers and the database.

Only two things are read: ``stream_writers`` (which instances write which
stream; every entry defaults to the main process, ``master``) and the
``database`` section (to build a connection URL when ``--db`` is not given).
YAML needs PyYAML; without it a JSON config (JSON is YAML too) still works.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from ..errors import FactstreamError
from .streams import SynapseIdStream

__all__ = ["ConfigError", "SynapseConfig", "load_config", "MAIN_INSTANCE"]

#: The instance name of Synapse's main process.
MAIN_INSTANCE = "master"


class ConfigError(FactstreamError):
    """A Synapse config file that cannot be read or makes no sense."""


@dataclass(frozen=True)
class SynapseConfig:
    """The writers of each ``stream_writers`` entry, and the database URL if the file has one."""

    stream_writers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    database_url: str | None = None

    def writers_of(self, stream: SynapseIdStream) -> tuple[str, ...]:
        """The instances allowed to write ``stream`` (empty: any process, positions never recorded)."""
        if stream.writers_setting:
            return self.stream_writers.get(stream.writers_setting, (MAIN_INSTANCE,))
        return stream.fixed_writers


def _parse(text: str, path: str) -> Any:
    try:
        import yaml
    except ImportError:
        try:
            return json.loads(text)
        except ValueError:
            raise ConfigError(f"{path}: reading a YAML config needs PyYAML (pip install pyyaml); "
                              "or pass --instances instead of --config") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None


def _database_url(section: Any) -> str | None:
    if not isinstance(section, Mapping) or section.get("name") not in ("psycopg2", "psycopg"):
        if isinstance(section, Mapping) and section.get("name") == "sqlite3":
            args = section.get("args") or {}
            db = args.get("database") if isinstance(args, Mapping) else None
            return f"sqlite:///{db}" if db else None
        return None
    args = section.get("args") or {}
    if not isinstance(args, Mapping):
        return None
    user = args.get("user")
    password = args.get("password")
    host = args.get("host") or "localhost"
    port = args.get("port")
    dbname = args.get("dbname") or args.get("database") or ""
    auth = ""
    if user:
        auth = quote(str(user), safe="")
        if password:
            auth += ":" + quote(str(password), safe="")
        auth += "@"
    hostpart = str(host) if not str(host).startswith("/") else ""
    url = f"postgresql://{auth}{hostpart}{':' + str(port) if port else ''}/{quote(str(dbname), safe='')}"
    if str(host).startswith("/"):  # a Unix socket directory
        url += f"?host={quote(str(host), safe='')}"
    return url


def load_config(path: str) -> SynapseConfig:
    """Read ``stream_writers`` and ``database`` from the Synapse config at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise ConfigError(f"cannot read Synapse config {path}: {err.strerror}") from None
    data = _parse(text, path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: not a Synapse config (expected a mapping at the top level)")
    writers: dict[str, tuple[str, ...]] = {}
    raw = data.get("stream_writers") or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: stream_writers must be a mapping of stream to instance name(s)")
    for key, value in raw.items():
        if isinstance(value, str):
            writers[str(key)] = (value,)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            writers[str(key)] = tuple(value)
        else:
            raise ConfigError(f"{path}: stream_writers.{key} must be an instance name or a list of them")
    return SynapseConfig(writers, _database_url(data.get("database")))
