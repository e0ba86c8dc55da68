"""Where a deployment's Redis is and what its channels are called.

:func:`connection_kwargs_from_url` turns a ``redis://``, ``rediss://`` or
``unix://`` URL into one redis-py connection's arguments; :class:`RedisChannels`
names the channels of one deployment as Synapse lays them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio.connection import AbstractConnection, parse_url
from redis.asyncio.connection import Connection as TcpRedisConnection

from ...redaction import redact_about
from ...redaction import redact_url as redacted_url


#: Suffix of the opt-in channel that carries USER_IP (``<server_name>/USER_IP``).
USER_IP_CHANNEL = "USER_IP"

# URL options that configure redis-py's pool, not one connection.
_POOL_ONLY_OPTIONS = ("max_connections", "timeout")


@dataclass(frozen=True)
class RedisChannels:
    """The channel names of one deployment (Synapse's layout)."""

    main: str
    user_ip: str

    @classmethod
    def for_server(cls, server_name: str) -> RedisChannels:
        """Channels of the deployment ``server_name``."""
        if not server_name or any(c in server_name for c in " \r\n"):
            raise ValueError(f"server name {server_name!r} must be non-empty without spaces or line breaks")
        return cls(main=server_name, user_ip=f"{server_name}/{USER_IP_CHANNEL}")

    def for_command(self, name: str) -> str:
        """The channel a command named ``name`` is published on."""
        return self.user_ip if name == "USER_IP" else self.main


def connection_kwargs_from_url(url: str, **overrides: Any) -> tuple[type[AbstractConnection], dict[str, Any]]:
    """The redis-py connection class and arguments for ``url``.

    Accepts ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS;
    options such as ``ssl_ca_certs``, ``ssl_cert_reqs`` or
    ``ssl_check_hostname`` go in the query string or in ``overrides``) and
    ``unix:///path/to/redis.sock[?db=N&password=...]``. Pub/sub channels are
    global to a Redis server: the database number does not separate
    deployments, the server name does.
    """
    try:
        kwargs: dict[str, Any] = dict(parse_url(url))
    except ValueError as err:
        # redis-py's message may quote a piece of the password (a '/' in it read as the end of the host)
        raise ValueError(f"bad Redis URL {redacted_url(url)!r}: {redact_about(str(err), url)}") from None
    path = urlsplit(url).path.strip("/") if url.lower().startswith(("redis://", "rediss://")) else ""
    if path and not path.isdigit():  # redis-py drops a path that is not a number and uses database 0
        raise ValueError(f"bad Redis URL {redacted_url(url)!r}: the path names the database by number "
                         f"(redis://host:port/0), not {redact_about(repr(path), url)}")
    for option in _POOL_ONLY_OPTIONS:
        kwargs.pop(option, None)
    cls: type[AbstractConnection] = kwargs.pop("connection_class", TcpRedisConnection)
    kwargs.update(overrides)
    return cls, kwargs
