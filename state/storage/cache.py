"""Layer 3's hot tier: a disposable Redis copy of committed state.

Entries carry the revision they were committed at and a write never replaces a newer
revision. Only committed state is written here, and any Redis failure is logged and
treated as a miss: without Redis agentstate is slower, never wrong.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from state.documents import codec
from state.storage.redis_client import CACHE_PUT

logger = logging.getLogger(__name__)

CachedEntry = tuple[int, dict[str, Any]]


class StateCache:
    """Read-through / write-through cache of session and user state documents."""

    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self.redis = client
        self.ttl_s = ttl_s
        self._put = client.register_script(CACHE_PUT)

    def get(self, key: str) -> CachedEntry | None:
        """``(revision, document)`` for ``key``, or None on a miss or a Redis failure."""
        try:
            rev, raw = self.redis.hmget(key, ["rev", "doc"])
        except redis.ResponseError as exc:
            logger.warning("cache entry %s is unreadable (%s); dropping it", key, exc)
            self.evict(key)  # not a hash: make room for a good copy
            return None
        except redis.RedisError as exc:
            logger.warning("cache read of %s failed, using the database: %s", key, exc)
            return None
        entry = decode_entry(key, rev, raw)
        if entry is None and (rev is not None or raw is not None):
            self.evict(key)  # unreadable: make room for a good copy
        return entry

    def put(self, key: str, revision: int, document: dict[str, Any]) -> bool:
        """Store ``document`` at ``revision`` unless a newer revision is cached."""
        try:
            return bool(self._put(keys=[key], args=[revision, codec.dumps(document), self.ttl_s]))
        except redis.RedisError as exc:
            logger.warning("cache write of %s failed (harmless): %s", key, exc)
            return False

    def evict(self, key: str) -> None:
        """Drop ``key`` (best effort)."""
        try:
            self.redis.delete(key)
        except redis.RedisError as exc:
            logger.warning("cache evict of %s failed: %s", key, exc)


def decode_entry(key: str, rev: Any, raw: Any) -> CachedEntry | None:
    """Parse a cached ``(rev, doc)`` pair; anything unreadable counts as a miss."""
    if rev is None or raw is None:
        return None
    try:
        document = codec.loads(raw)
        revision = int(rev)
    except ValueError:
        logger.warning("cache entry %s is unreadable; ignoring it", key)
        return None
    if not isinstance(document, dict):
        return None
    return revision, document
