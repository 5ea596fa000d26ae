"""Redis clients (one per process and URL) and the Lua scripts agentstate runs."""

from __future__ import annotations

import os
import threading

import redis

_SOCKET_TIMEOUT_S = 5.0
_CONNECT_TIMEOUT_S = 2.0

_clients: dict[tuple[str, int], redis.Redis] = {}
_guard = threading.Lock()


def get_redis(url: str) -> redis.Redis:
    """The client for ``url`` in this process; passwords and ACL users come in the URL."""
    key = (url, os.getpid())
    client = _clients.get(key)
    if client is None:
        with _guard:
            client = _clients.get(key)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    socket_timeout=_SOCKET_TIMEOUT_S,
                    socket_connect_timeout=_CONNECT_TIMEOUT_S,
                    health_check_interval=30,
                )
                _clients[key] = client
    return client


def forget_clients() -> None:
    """Drop every client of this process (tests)."""
    with _guard:
        _clients.clear()


# KEYS[1] lock; ARGV token, ttl_ms. Returns 1 if this token now holds the lock.
ACQUIRE = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0"

# KEYS[1] lock, KEYS[2] cache hash; ARGV token, ttl_ms.
# Returns {1, rev, payload} (rev/payload false on a cache miss) or {0}.
ACQUIRE_AND_READ = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0} end
local entry = redis.call('HMGET', KEYS[2], 'rev', 'doc')
return {1, entry[1], entry[2]}
"""

# KEYS[1] lock; ARGV token. Compare-and-delete.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS[1] lock; ARGV token, ttl_ms. Extends the lock only for its holder.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] cache hash; ARGV rev, payload, ttl_s. Never lets an older revision win.
CACHE_PUT = """
local current = redis.call('HGET', KEYS[1], 'rev')
if current and tonumber(current) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'rev', ARGV[1], 'doc', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS[1] cache hash, KEYS[2] lock; ARGV rev, payload, ttl_s, token, events channel ("":
# none). Write-through after a commit, the push that wakes the session's event followers,
# and release, in one round trip.
CACHE_PUT_AND_RELEASE = """
local current = redis.call('HGET', KEYS[1], 'rev')
if not (current and tonumber(current) > tonumber(ARGV[1])) then
  redis.call('HSET', KEYS[1], 'rev', ARGV[1], 'doc', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
if ARGV[5] and ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], ARGV[1]) end
if redis.call('GET', KEYS[2]) == ARGV[4] then return redis.call('DEL', KEYS[2]) end
return 0
"""
