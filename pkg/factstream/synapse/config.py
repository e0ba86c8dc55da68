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

#: The ``stream_writers`` entries Synapse 1.163 accepts; with any other key it refuses to start.
WRITER_SETTINGS = ("events", "typing", "to_device", "account_data", "receipts", "presence", "push_rules",
                   "device_lists", "thread_subscriptions", "quarantined_media_changes")

#: Entries Synapse allows exactly one writer for.
SINGLE_WRITER_SETTINGS = ("typing", "to_device", "account_data", "presence", "push_rules")


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
    _check_writers(path, writers, data.get("instance_map"))
    return SynapseConfig(writers, _database_url(data.get("database")))


def _check_writers(path: str, writers: Mapping[str, tuple[str, ...]], instance_map: Any) -> None:
    """ConfigError for a stream_writers section Synapse itself refuses to start with.

    Judging positions against such a config would call real writers stale (a
    typo'd key silently falls back to master), so the check stops there.
    """
    import difflib

    for key in writers:
        if key not in WRITER_SETTINGS:
            near = difflib.get_close_matches(key, WRITER_SETTINGS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"{path}: stream_writers.{key} is not a stream Synapse knows{hint}; Synapse refuses "
                              f"to start with it. Known entries: {', '.join(WRITER_SETTINGS)}")
    mapped = set(instance_map) if isinstance(instance_map, Mapping) else set()
    for key, names in writers.items():
        if not names and key in ("events", "receipts", "device_lists", "thread_subscriptions",
                                 "quarantined_media_changes"):
            raise ConfigError(f"{path}: stream_writers.{key} is empty; Synapse needs at least one writer for it")
        if key in SINGLE_WRITER_SETTINGS and len(names) != 1:
            raise ConfigError(f"{path}: stream_writers.{key} lists {len(names)} writers; Synapse allows exactly one")
        for name in names:
            if name != MAIN_INSTANCE and name not in mapped:
                raise ConfigError(f"{path}: {name!r} writes {key} (stream_writers.{key}) but has no instance_map "
                                  f"entry; Synapse refuses to start until instance_map names {name}'s replication "
                                  "host and port")
