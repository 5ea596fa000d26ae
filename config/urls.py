"""Checks of the URLs in Settings: a malformed or unsupported URL is refused when the
settings are read, with a message that names the problem but never echoes the URL (it may
carry a password)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# The database backends (and drivers) the stores are written and tested for.
DATABASE_DRIVERS = {"sqlite": ("pysqlite",), "postgresql": ("psycopg2",)}
REDIS_SCHEMES = ("redis", "rediss", "unix")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*://")


def check_database_url(url: str) -> str:
    """``url`` if SQLAlchemy can parse it and it names a supported backend and driver."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ValueError("not a database URL (postgresql+psycopg2://... or sqlite:///...)") from exc
    backend = parsed.get_backend_name()
    # The driver is only looked up for a known backend (it imports the dialect).
    driver = parsed.get_driver_name() if backend in DATABASE_DRIVERS else None
    if driver not in DATABASE_DRIVERS.get(backend, ()):
        used = f" (driver {driver})" if driver else ""
        raise ValueError(
            f"unsupported database {parsed.drivername!r}{used}: "
            "use postgresql+psycopg2://... or sqlite:///..."
        )
    return url


def check_redis_url(url: str) -> str:
    """``url`` if redis-py can connect with it (scheme, port, database number)."""
    from redis.connection import parse_url

    if not url.startswith(tuple(f"{scheme}://" for scheme in REDIS_SCHEMES)):
        raise ValueError("not a Redis URL (redis://, rediss:// or unix://)")
    parse_url(url)  # type: ignore[no-untyped-call]  # raises ValueError naming the problem
    return url


def check_broker_url(url: str) -> str:
    """``url`` if it looks like a kombu broker URL ('' means: the Redis URL)."""
    for part in filter(None, url.split(";")):  # kombu's failover list
        if not _SCHEME.match(part):
            raise ValueError("not a broker URL (redis://... or amqp://...)")
        if part.startswith(("redis://", "rediss://")):
            check_redis_url(part)
        else:
            urlsplit(part).port  # noqa: B018 - raises ValueError for a port that is no number
    return url
