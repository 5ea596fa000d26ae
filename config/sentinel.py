"""``redis+sentinel://`` URLs: a Redis service found through Redis Sentinel.

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]

Every ``host:port`` is a Sentinel; ``service_name`` is the name the Sentinels monitor
(``sentinel monitor <name> ...``); the credentials are those of the Redis primary and
replicas (the Sentinels themselves are reached without a password). The same URL serves
``AGENTSTATE_REDIS_URL`` (redis-py's Sentinel client) and ``AGENTSTATE_BROKER_URL``
(kombu's sentinel transport, see :meth:`SentinelURL.kombu_url`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

from state.errors import ConfigurationError

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names a Sentinel-managed Redis service."""
    return url.split("://", 1)[0].lower() == SCHEME


@dataclass(frozen=True)
class SentinelURL:
    """The parts of a ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """Split ``url``; ConfigurationError (never showing the password) if it is bad."""
        if not is_sentinel_url(url):
            raise ConfigurationError(f"not a {SCHEME}:// URL")
        rest = url.split("://", 1)[1]
        location, _, path = rest.partition("/")
        credentials, _, hosts = location.rpartition("@")
        username, password = _credentials(credentials)
        sentinels = tuple(_host_port(item) for item in hosts.split(",") if item.strip())
        if not sentinels:
            raise ConfigurationError(f"{SCHEME}:// URL names no Sentinel host")
        service, _, db = path.strip("/").partition("/")
        if not service:
            raise ConfigurationError(
                f"{SCHEME}:// URL needs the monitored service name as its path"
            )
        if db and not db.isdigit():
            raise ConfigurationError(f"{SCHEME}:// database must be a number, not {db!r}")
        return cls(sentinels, unquote(service), int(db or 0), username, password)

    def kombu_url(self) -> str:
        """The broker URL kombu's sentinel transport reads: one ``sentinel://`` URL per
        Sentinel, ``;``-separated (the service name goes in the transport options)."""
        auth = ""
        if self.password is not None or self.username is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        return ";".join(
            f"sentinel://{auth}{_bracketed(host)}:{port}/{self.db}" for host, port in self.sentinels
        )


def _credentials(text: str) -> tuple[str | None, str | None]:
    if not text:
        return None, None
    user, colon, password = text.partition(":")
    return (unquote(user) or None), (unquote(password) if colon else None)


def _host_port(item: str) -> tuple[str, int]:
    host, _, port = item.strip().rpartition(":")
    if not host:  # no port given
        return item.strip(), DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"{SCHEME}:// bad Sentinel port in {item.strip()!r}")
    return host.strip("[]"), int(port)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
