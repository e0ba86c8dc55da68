"""What a Synapse config (homeserver.yaml, or several files) says about writers, the database and Redis.

Read: ``stream_writers`` (which instances write which stream; every entry
defaults to the main process, ``master``), the ``database`` section (to build
a connection URL when ``--db`` is not given), the ``redis`` section and
``server_name`` (the watch's channel when ``--redis``/``--server-name`` are
not given). Several paths are read the way Synapse reads its ``-c`` options:
in order, a directory standing for the ``*.yaml`` files in it (sorted), each
file replacing whole top-level sections of the ones before (a shallow merge).
YAML is read with PyYAML (a dependency; the ImportError path below is for a broken install).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from ..errors import FactstreamError
from .streams import SynapseIdStream

__all__ = ["ConfigError", "SynapseConfig", "load_config", "config_files", "MAIN_INSTANCE", "WIRE_WRITER_SETTINGS"]

#: The instance name of Synapse's main process.
MAIN_INSTANCE = "master"

#: The ``stream_writers`` entries Synapse 1.163 accepts; with any other key it refuses to start.
WRITER_SETTINGS = ("events", "typing", "to_device", "account_data", "receipts", "presence", "push_rules",
                   "device_lists", "thread_subscriptions", "quarantined_media_changes")

#: Entries Synapse allows exactly one writer for.
SINGLE_WRITER_SETTINGS = ("typing", "to_device", "account_data", "presence", "push_rules")

#: Replication stream -> the ``stream_writers`` entry whose instances announce it on the channel (None: only the
#: main process does). Read off Synapse 1.163's replication handler. ``caches`` is left out: every process
#: announces it.
WIRE_WRITER_SETTINGS: Mapping[str, str | None] = {
    "events": "events", "backfill": "events", "profile_updates": "events", "sticky_events": "events",
    "presence": "presence", "presence_federation": "presence", "typing": "typing", "receipts": "receipts",
    "push_rules": "push_rules", "device_lists": "device_lists", "to_device": "to_device",
    "account_data": "account_data", "thread_subscriptions": "thread_subscriptions",
    "quarantined_media": "quarantined_media_changes",
    "pushers": None, "federation": None, "un_partial_stated_room": None, "un_partial_stated_event": None,
}

#: Streams the main process does not always announce (``federation``: not once federation senders are
#: configured), so a writer of them that stays quiet is not a problem.
MAYBE_QUIET_STREAMS = frozenset({"federation"})


class ConfigError(FactstreamError):
    """A Synapse config file that cannot be read or makes no sense."""


@dataclass(frozen=True)
class SynapseConfig:
    """What the config says: writers per ``stream_writers`` entry, database URL, Redis URL, server name.

    ``files`` are the files read, in order; ``notes`` say which paths were
    skipped the way Synapse skips them (not ``*.yaml`` in a directory, empty).
    The URLs may hold passwords: they are kept out of ``repr``.
    """

    stream_writers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    database_url: str | None = field(default=None, repr=False)
    server_name: str | None = None
    redis_enabled: bool = False
    redis_url: str | None = field(default=None, repr=False)
    files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        """The files read, for messages."""
        return " + ".join(self.files) if self.files else "the config"

    def writers_of(self, stream: SynapseIdStream) -> tuple[str, ...]:
        """The instances allowed to write ``stream`` (empty: any process, positions never recorded)."""
        if stream.writers_setting:
            return self.stream_writers.get(stream.writers_setting, (MAIN_INSTANCE,))
        return stream.fixed_writers

    def wire_writers(self) -> dict[str, tuple[str, ...]]:
        """Replication stream -> the instances that announce it on the channel (all but ``caches``)."""
        return {wire: (self.stream_writers.get(setting, (MAIN_INSTANCE,)) if setting else (MAIN_INSTANCE,))
                for wire, setting in WIRE_WRITER_SETTINGS.items()}


def _parse(text: str, path: str) -> Any:
    if not text.strip():
        return None  # an empty file: no settings
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


def _redis_url(section: Any, where: str) -> tuple[bool, str | None]:
    """(enabled, URL) from the ``redis`` section, as Synapse's processes connect to it.

    ConfigError for a section Synapse refuses (a password both inline and in a
    file, a username without a password) or that names no usable endpoint.
    The password, if any, is in the URL: callers print it only redacted.
    """
    if section is None:
        return False, None
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}: redis must be a mapping (enabled, host, port, ...)")
    if not section.get("enabled", False):
        return False, None
    password = section.get("password")
    password_path = section.get("password_path")
    if password_path:
        if password:
            raise ConfigError(f"{where}: redis has both password and password_path; Synapse refuses to start "
                              "with both: keep one")
        try:
            with open(str(password_path), encoding="utf-8") as f:
                password = f.read().strip()
        except OSError as err:
            raise ConfigError(f"{where}: cannot read redis.password_path {password_path}: {err.strerror}") from None
    username = section.get("username")
    if username and password is None:
        raise ConfigError(f"{where}: redis.username is set without redis.password (or password_path); Synapse "
                          "refuses to start with it")
    auth = ""
    if username or password:
        auth = (quote(str(username), safe="") if username else "") + (
            ":" + quote(str(password), safe="") if password else "") + "@"
    dbid = section.get("dbid")
    if dbid is not None and (isinstance(dbid, bool) or not isinstance(dbid, int)):
        raise ConfigError(f"{where}: redis.dbid must be a number, not {dbid!r}")
    path = section.get("path")
    if path:
        query = f"?db={dbid}" if dbid is not None else ""
        return True, f"unix://{auth}{quote(str(path), safe='/')}{query}"
    host = section.get("host", "localhost")
    port = section.get("port", 6379)
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{where}: redis.host must be a host name or address, not {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"{where}: redis.port must be a port number (1-65535), not {port!r}")
    hostpart = f"[{host}]" if ":" in host and not host.startswith("[") else host
    options: dict[str, str] = {}
    if section.get("use_tls"):
        # The files Synapse's TLS context loads, under the names the Redis client takes them by.
        for key, option in (("certificate_file", "ssl_certfile"), ("private_key_file", "ssl_keyfile")):
            if section.get(key):
                options[option] = str(section[key])
        if section.get("ca_file"):
            options["ssl_ca_certs"] = str(section["ca_file"])
        elif section.get("ca_path"):
            options["ssl_ca_path"] = str(section["ca_path"])
    scheme = "rediss" if section.get("use_tls") else "redis"
    query = f"?{urlencode(options)}" if options else ""
    return True, f"{scheme}://{auth}{hostpart}:{port}/{dbid if dbid is not None else 0}{query}"


def config_files(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """The files Synapse reads for ``-c`` ``paths``, in order, and a note per directory entry it skips.

    A directory stands for its ``*.yaml`` files in sorted order; its
    subdirectories and other files are skipped (as Synapse does, saying so).
    """
    files: list[str] = []
    notes: list[str] = []
    for path in paths:
        if not os.path.isdir(path):
            files.append(path)
            continue
        try:
            entries = os.listdir(path)
        except OSError as err:
            raise ConfigError(f"cannot read Synapse config directory {path}: {err.strerror}") from None
        found = []
        for entry in entries:
            full = os.path.join(path, entry)
            if not os.path.isfile(full):
                notes.append(f"{full}: a subdirectory of a config directory, ignored (Synapse ignores it too)")
            elif not entry.endswith(".yaml"):
                notes.append(f"{full}: not a *.yaml file, ignored (Synapse reads only *.yaml from a directory)")
            else:
                found.append(full)
        if not found:
            notes.append(f"{path}: a config directory without any *.yaml file")
        files.extend(sorted(found))
    return files, notes


def load_config(paths: str | Sequence[str]) -> SynapseConfig:
    """Read the Synapse config at ``paths`` (a file, a directory, or several, merged as Synapse merges them)."""
    given = [paths] if isinstance(paths, str) else list(paths)
    files, notes = config_files(given)
    if not files:
        raise ConfigError(f"no Synapse config file in {', '.join(given)} (a directory is read for its *.yaml files)")
    data: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise ConfigError(f"cannot read Synapse config {path}: {err.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"cannot read Synapse config {path}: not UTF-8 text") from None
        parsed = _parse(text, path)
        if not isinstance(parsed, Mapping):
            if len(files) == 1:
                raise ConfigError(f"{path}: not a Synapse config (expected a mapping at the top level)")
            notes.append(f"{path}: empty or not a mapping of settings, ignored (Synapse ignores it too)")
            continue
        for key, value in parsed.items():
            data[str(key)] = value  # a later file replaces a whole top-level section, as in Synapse
            origin[str(key)] = path
    if not origin:
        raise ConfigError(f"{' + '.join(files)}: not a Synapse config (no file holds a mapping of settings)")
    where = origin.get("stream_writers", files[-1])
    writers: dict[str, tuple[str, ...]] = {}
    raw = data.get("stream_writers") or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: stream_writers must be a mapping of stream to instance name(s)")
    for key, value in raw.items():
        if isinstance(value, str):
            writers[str(key)] = (value,)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            writers[str(key)] = tuple(value)
        else:
            raise ConfigError(f"{where}: stream_writers.{key} must be an instance name or a list of them")
    _check_writers(where, writers, data.get("instance_map"))
    enabled, redis_url = _redis_url(data.get("redis"), origin.get("redis", files[-1]))
    server_name = data.get("server_name")
    return SynapseConfig(writers, _database_url(data.get("database")),
                         server_name=server_name if isinstance(server_name, str) and server_name else None,
                         redis_enabled=enabled, redis_url=redis_url, files=tuple(files), notes=tuple(notes))


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
