"""kombu's Redis transport, minus a per-publish cost.

Stock kombu builds a new redis-py client for every publish; with redis-py 8 building a
client costs ~170 us (it copies ~170 response callbacks), more than the publish itself.
This transport keeps one client per channel (redis-py clients are thread-safe and share
the channel's connection pool). Everything else is kombu's own code.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


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
