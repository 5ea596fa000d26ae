"""Redis clients (one per process and URL) and the Lua scripts agentstate runs.

A ``redis://`` or ``rediss://`` URL names one server; a ``redis+sentinel://`` URL
(config/sentinel.py) names a service whose primary the Sentinels know: its client asks
them again whenever a connection to the primary fails, so a failover costs the commands
that were in flight (retried by the tasks), not the process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel

from config.sentinel import SentinelURL, is_sentinel_url

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
                client = _connect[is_sentinel_url(url)](url)
                _clients[key] = client
    return client


def _server_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=_SOCKET_TIMEOUT_S,
        socket_connect_timeout=_CONNECT_TIMEOUT_S,
        health_check_interval=30,
    )


def _sentinel_client(url: str) -> redis.Redis:
    target = SentinelURL.parse(url)
    timeouts = {"socket_timeout": _SOCKET_TIMEOUT_S, "socket_connect_timeout": _CONNECT_TIMEOUT_S}
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=timeouts, **timeouts)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(target.service, **_primary(target))  # type: ignore[no-untyped-call]
    return client


def _primary(target: SentinelURL) -> dict[str, Any]:
    """How a Sentinel client connects to the primary it finds."""
    return {
        "db": target.db,
        "username": target.username,
        "password": target.password,
        "health_check_interval": 30,
    }


_connect: dict[bool, Callable[[str], redis.Redis]] = {False: _server_client, True: _sentinel_client}


def async_redis(url: str) -> aioredis.Redis:
    """A new asyncio client for ``url`` (one per event loop: its connections belong to
    the loop that opened them), with the timeouts of the sync clients."""
    timeouts = {"socket_timeout": _SOCKET_TIMEOUT_S, "socket_connect_timeout": _CONNECT_TIMEOUT_S}
    if not is_sentinel_url(url):
        return aioredis.Redis.from_url(
            url,
            socket_timeout=_SOCKET_TIMEOUT_S,
            socket_connect_timeout=_CONNECT_TIMEOUT_S,
            health_check_interval=30,
        )
    target = SentinelURL.parse(url)
    sentinel = AsyncSentinel(list(target.sentinels), sentinel_kwargs=timeouts, **timeouts)  # type: ignore[no-untyped-call]
    client: aioredis.Redis = sentinel.master_for(target.service, **_primary(target))
    return client


def forget_clients() -> None:
    """Drop every client of this process (tests)."""
    with _guard:
        _clients.clear()


# KEYS[1] lock; ARGV token, ttl_ms. Returns 1 if this token now holds the lock.
ACQUIRE = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0"

# Every script that reads a cache entry treats an unreadable one (a revision that is not
# a plain integer, a key that is not a hash) as a miss, and a write replaces it: a bad
# entry must never fail a script, least of all one that also releases a lock.

# KEYS[1] lock, KEYS[2] cache hash; ARGV token, ttl_ms.
# Returns {1, rev, payload} (rev/payload false on a cache miss) or {0}.
ACQUIRE_AND_READ = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0} end
local entry = redis.pcall('HMGET', KEYS[2], 'rev', 'doc')
if entry.err then return {1, false, false} end
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

# Writes (rev, payload) to the hash KEYS[1] unless it holds a newer readable revision.
_CACHE_WRITE = """
local function cache_write(key, rev, payload, ttl_s)
  local current = redis.pcall('HGET', key, 'rev')
  if type(current) == 'table' then
    redis.call('DEL', key)
  elseif type(current) == 'string' and #current <= 15 and string.match(current, '^%d+$')
      and tonumber(current) > tonumber(rev) then
    return 0
  end
  redis.call('HSET', key, 'rev', rev, 'doc', payload)
  redis.call('EXPIRE', key, ttl_s)
  return 1
end
"""

# KEYS[1] cache hash; ARGV rev, payload, ttl_s. Never lets an older revision win.
CACHE_PUT = _CACHE_WRITE + "return cache_write(KEYS[1], ARGV[1], ARGV[2], ARGV[3])"

# KEYS[1] cache hash; ARGV rev, payload, ttl_s, events channel ("": none). The write
# and the push of a commit made without the lock (a quick phase run from a carried
# snapshot), in one round trip.
CACHE_PUT_AND_PUSH = (
    _CACHE_WRITE
    + """
pcall(cache_write, KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if ARGV[4] and ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[4], ARGV[1]) end
return 1
"""
)

# KEYS[1] cache hash, KEYS[2] lock; ARGV rev, payload, ttl_s, token, events channel ("":
# none). Write-through after a commit, the push that wakes the session's event followers,
# and release, in one round trip. The release comes first
# and the write cannot fail the script: the lock is freed whatever the cache holds.
CACHE_PUT_AND_RELEASE = (
    _CACHE_WRITE
    + """
local released = 0
if redis.call('GET', KEYS[2]) == ARGV[4] then released = redis.call('DEL', KEYS[2]) end
pcall(cache_write, KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if ARGV[5] and ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], ARGV[1]) end
return released
"""
)

# KEYS[1] stream hash (message_id, started, bytes), KEYS[2] chunk list; ARGV text,
# message_id, turn started_at, max_bytes, ttl_ms, tokens channel. One chunk of the
# message being answered: stored (for followers that connect later) and published in one
# step, so what a follower reads and what it is sent after never overlap or leave a gap.
# A chunk of a later turn replaces what is stored; one of an earlier turn (a handler
# still running after its turn was cancelled) is dropped. Returns the chunk's n, 0 if
# it was dropped, -1 if it would take the turn past max_bytes.
STREAM_CHUNK = """
local current = redis.pcall('HMGET', KEYS[1], 'message_id', 'started')
if current.err then current = {false, false} end
if current[1] ~= ARGV[2] then
  if current[2] and current[2] > ARGV[3] then return 0 end
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('HSET', KEYS[1], 'message_id', ARGV[2], 'started', ARGV[3], 'bytes', 0)
end
local total = redis.call('HINCRBY', KEYS[1], 'bytes', #ARGV[1])
if total > tonumber(ARGV[4]) then
  redis.call('HINCRBY', KEYS[1], 'bytes', -#ARGV[1])
  return -1
end
local n = redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PUBLISH', ARGV[6], n .. '\\n' .. ARGV[2] .. '\\n' .. ARGV[1])
return n
"""

# KEYS[1] stream hash, KEYS[2] chunk list. What a follower that connects mid-answer
# catches up on: {message_id, chunks...} ({} when nothing is stored).
STREAM_READ = """
local message_id = redis.pcall('HGET', KEYS[1], 'message_id')
if type(message_id) ~= 'string' then return {} end
local chunks = redis.call('LRANGE', KEYS[2], 0, -1)
table.insert(chunks, 1, message_id)
return chunks
"""

# KEYS[1] stream hash, KEYS[2] chunk list; ARGV message_id. Forget the chunks once the
# message's reply is committed (only if they are still that message's).
STREAM_END = """
if redis.pcall('HGET', KEYS[1], 'message_id') == ARGV[1] then
  return redis.call('DEL', KEYS[1], KEYS[2])
end
return 0
"""
