"""kombu's Redis transport, minus a per-publish cost.

Stock kombu builds a new redis-py client for every publish; with redis-py 8 building a
client costs ~170 us (it copies ~170 response callbacks), more than the publish itself.
This transport keeps one client per channel (redis-py clients are thread-safe and share
the channel's connection pool). Everything else is kombu's own code.

Tools that pick a broker client by the URL's scheme (Flower's broker page and queue
lengths) must still see ``redis://``: the app's connections (``AMQP`` below, the app's
``amqp`` class) report this transport under kombu's name for the Redis transport.
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP as CeleryAMQP
from kombu.connection import Connection as KombuConnection
from kombu.transport import redis as kombu_redis

from config.brokers import REDIS_TRANSPORTS


class Channel(kombu_redis.Channel):
    """A Redis channel that reuses its synchronous client."""

    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        if self._sync_client is None:
            self._sync_client = super()._create_client(asynchronous=False)  # type: ignore[no-untyped-call]
        return self._sync_client


class Transport(kombu_redis.Transport):
    """The Redis transport with client reuse."""

    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """kombu's sentinel channel (the primary looked up through the Sentinels), with
    client reuse."""


class SentinelTransport(kombu_redis.SentinelTransport):
    """The Redis Sentinel transport with client reuse."""

    Channel = SentinelChannel


class TlsTransport(Transport):
    """The same transport, for ``rediss://`` URLs (so that their scheme survives)."""


class Connection(KombuConnection):
    """A kombu Connection whose URL (``as_uri``) names our transports by their scheme."""

    resolve_aliases = {
        **KombuConnection.resolve_aliases,
        **{path: scheme for scheme, path in REDIS_TRANSPORTS.items()},
        "tasks.dispatch.transport:SentinelTransport": "sentinel",
    }


class AMQP(CeleryAMQP):  # type: ignore[misc]
    """The app's messaging API, building its connections with :class:`Connection`."""

    Connection = Connection
    BrokerConnection = Connection
