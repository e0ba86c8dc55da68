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

import errno
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from ..errors import FactstreamError
from .streams import SynapseIdStream

__all__ = ["ConfigError", "DatabaseSetting", "SynapseConfig", "load_config", "config_files", "MAIN_INSTANCE",
           "WIRE_WRITER_SETTINGS"]

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
class DatabaseSetting:
    """The database the config makes Synapse's main store use, as a URL for ``--db``, or why there is none.

    ``url`` holds the password (percent-encoded): print it only through
    :func:`~factstream.redaction.redact_url`. ``error`` says why the config
    names no usable database; it matters only when no ``--db`` is given.
    """

    url: str | None = field(default=None, repr=False)
    engine: str | None = None
    source: str | None = None
    error: str | None = None

    @property
    def origin(self) -> str:
        """Where the URL came from, for messages."""
        return f"the database section of {self.source}" if self.source else "the config"


@dataclass(frozen=True)
class SynapseConfig:
    """What the config says: writers per ``stream_writers`` entry, database, Redis URL, server name.

    ``files`` are the files read, in order; ``notes`` say which paths were
    skipped the way Synapse skips them (not ``*.yaml`` in a directory, empty).
    The URLs may hold passwords: they are kept out of ``repr``.
    """

    stream_writers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    database: DatabaseSetting = field(default_factory=lambda: DatabaseSetting(error="no database section"))
    server_name: str | None = None
    redis_section: bool = False
    redis_enabled: bool = False
    redis_url: str | None = field(default=None, repr=False)
    files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        """The files read, for messages."""
        return " + ".join(self.files) if self.files else "the config"

    @property
    def database_url(self) -> str | None:
        """The database URL the config gives (password included), None when it gives none."""
        return self.database.url

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
        raise ConfigError(_yaml_error(path, err)) from None


def _yaml_error(path: str, err: Any) -> str:
    """Where a YAML file goes wrong and how (the offending line is not quoted: it may hold a password)."""
    from ..redaction import redact_text

    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    context = getattr(err, "context", None)
    context_mark = getattr(err, "context_mark", None)
    if mark is None or not problem:
        what = (str(err).splitlines() or [type(err).__name__])[0]
        return f"{path}: not valid YAML ({redact_text(what)}); Synapse cannot read it either: fix the file"
    where = f"{path} line {mark.line + 1}, column {mark.column + 1}"
    why = redact_text(str(problem))
    if "'\\t'" in why:
        why += ", a tab: YAML indents with spaces only"
    if context:
        started = (f" that starts at line {context_mark.line + 1}, column {context_mark.column + 1}"
                   if context_mark is not None and context_mark.line != mark.line else "")
        why += f" ({redact_text(str(context))}{started})"
    return f"{where}: not valid YAML: {why}; Synapse cannot read it either: fix the file"


#: ``database.args`` keys that are psycopg2's own Python arguments, not libpq connection settings.
_DRIVER_ARGS = frozenset({"connection_factory", "cursor_factory", "async", "async_"})

#: Connection settings whose value is a secret besides ``password``: kept out of any URL (see _postgres_url).
_SECRET_ARGS = frozenset({"sslpassword"})

#: A host that reads unchanged as a URL's host (a name or an IPv4 address); others go in ``?host=``.
_PLAIN_HOST = re.compile(r"[A-Za-z0-9_.\-]+")
_IPV6_HOST = re.compile(r"[0-9A-Fa-f]*:[0-9A-Fa-f:.]*")


def _database(data: Mapping[str, Any], origin: Mapping[str, str], files: Sequence[str]) -> DatabaseSetting:
    """The main store's database as Synapse connects to it (``database``, ``databases``, ``database_path``)."""
    source = origin.get("database") or origin.get("databases") or origin.get("database_path")
    if data.get("database") and data.get("databases"):
        return DatabaseSetting(source=source, error=(
            f"{origin['database']} has a database section and {origin['databases']} a databases section; Synapse "
            "refuses to start with both: keep one (or pass --db URL)"))
    where = "database"
    section = data.get("database")
    if not section and data.get("databases"):
        stores = data["databases"]
        if not isinstance(stores, Mapping):
            return DatabaseSetting(source=source, error=f"{source}: databases must be a mapping of name to database")
        main = [(name, db) for name, db in stores.items()
                if isinstance(db, Mapping) and "main" in (db.get("data_stores") or ("main", "state"))]
        if len(main) != 1:
            return DatabaseSetting(source=source, error=(
                f"{source}: databases names {len(main)} database(s) holding the main data store (data_stores: "
                "[main, ...]); Synapse needs exactly one: pass --db URL"))
        where = f"databases.{main[0][0]}"
        section = main[0][1]
    path = data.get("database_path")
    if not section and not path:
        return DatabaseSetting(error=(
            f"{' + '.join(files)}: no database section (nor databases, nor database_path), so the config names "
            "no database (Synapse refuses to start without one); pass --db URL, or also -c the file that holds it"))
    if section and not isinstance(section, Mapping):
        return DatabaseSetting(source=source, error=f"{source}: {where} must be a mapping (name, args)")
    section = section or {}
    name = section.get("name", "sqlite3")
    args = section.get("args") or {}
    if not isinstance(args, Mapping):
        return DatabaseSetting(source=source, error=f"{source}: {where}.args must be a mapping (user, host, ...)")
    if name == "sqlite3":
        db = os.path.abspath(str(path)) if path else args.get("database")  # database_path wins, as in Synapse
        if path:
            source = origin.get("database_path", source)
        if not db or str(db) == ":memory:":
            return DatabaseSetting(engine="sqlite", source=source, error=(
                f"{source}: {where} is SQLite without a database file (args.database); pass --db sqlite:///PATH"))
        return DatabaseSetting(f"sqlite:///{db}", "sqlite", source)
    if name not in ("psycopg2", "psycopg"):
        return DatabaseSetting(source=source, error=(
            f"{source}: {where}.name is {name!r}; Synapse supports psycopg2 (PostgreSQL) or sqlite3"))
    try:
        return DatabaseSetting(_postgres_url(args, f"{source}: {where}.args"), "postgresql", source)
    except ConfigError as err:
        return DatabaseSetting(engine="postgresql", source=source, error=str(err))


def _postgres_url(args: Mapping[str, Any], where: str) -> str:
    """A ``postgresql://`` URL that makes libpq connect as psycopg2.connect(**args) does for Synapse.

    Synapse hands every ``args`` entry but the pool's ``cp_*`` to
    psycopg2.connect, which passes them to libpq as connection settings
    (``database`` standing for ``dbname``, ``dsn`` a connection string the
    others override, None values dropped). A setting left out keeps libpq's
    default, as for Synapse: no host is the local Unix socket (or PGHOST), no
    dbname the user's name. A host that is a socket directory, a list, or
    anything else that is not a plain name goes in ``?host=``.
    """
    params: dict[str, str] = {}
    dsn = args.get("dsn")
    if dsn:
        from psycopg.conninfo import conninfo_to_dict

        try:
            params.update({k: str(v) for k, v in conninfo_to_dict(str(dsn)).items() if v is not None})
        except Exception:  # its text may hold a password: never quoted
            raise ConfigError(f"{where}.dsn is not a libpq connection string (key=value ...)") from None
    if "database" in args and "dbname" in args:
        raise ConfigError(f"{where} has both database and dbname; psycopg2 refuses both (Synapse does not "
                          "start): keep one")
    for key, value in args.items():
        key = "dbname" if key == "database" else str(key)
        if key.startswith("cp_") or key == "dsn" or key in _DRIVER_ARGS or value is None:
            continue
        params[key] = str(value)
    for key in _SECRET_ARGS & set(params):
        raise ConfigError(f"{where}.{key}: factstream does not read this setting from the config (it would have "
                          "to go into a URL); pass --db URL")
    user = params.pop("user", "")
    password = params.pop("password", "")
    host = params.pop("host", "")
    port = params.pop("port", "")
    dbname = params.pop("dbname", "")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"{where}.port must be a port number (1-65535), not {port!r}")
    auth = ""
    if user or password:
        auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "") + "@"
    hostpart = ""
    query: dict[str, str] = {}
    if host and (_PLAIN_HOST.fullmatch(host) or _IPV6_HOST.fullmatch(host)):
        hostpart = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    else:
        if host:  # a Unix socket directory, several hosts, an IPv6 address: libpq reads it from the query
            query["host"] = host
        if port:
            query["port"] = port
    query.update(params)
    tail = f"?{urlencode(query, quote_via=quote, safe='/')}" if query else ""
    return f"postgresql://{auth}{hostpart}/{quote(dbname, safe='')}{tail}"


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
        others = sorted(os.path.basename(n.split(": ", 1)[0]) for n in notes if "not a *.yaml file" in n)
        held = f"; it holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''}, which Synapse skips too" \
            if others else ""
        raise ConfigError(f"no Synapse config file in {', '.join(given)}: a directory is read for its *.yaml files "
                          f"only (as Synapse reads it){held}; give homeserver.yaml itself (-c PATH), or the "
                          "directory that holds the *.yaml files")
    data: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            fix = ("; check the path (-c takes homeserver.yaml, or a directory of *.yaml files)"
                   if err.errno == errno.ENOENT else "")
            raise ConfigError(f"cannot read Synapse config {path}: {err.strerror}{fix}") from None
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
    return SynapseConfig(writers, _database(data, origin, files),
                         server_name=server_name if isinstance(server_name, str) and server_name else None,
                         redis_section="redis" in data, redis_enabled=enabled, redis_url=redis_url, files=tuple(files), notes=tuple(notes))


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
