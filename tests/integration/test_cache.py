"""The Redis hot tier: disposable, versioned, never ahead of the database."""

from __future__ import annotations

import time

import redis

from config import Settings
from state.lock import DistributedStateSync
from state.sessions.snapshot import SessionChange
from state.sessions.store import SessionStore
from state.storage import keys
from state.storage.backend import Backend
from state.storage.cache import StateCache
from state.store import PersistentStateManager
from tests.support import make_settings, uid


def test_flushdb_loses_speed_not_state(settings: Settings, redis_client: redis.Redis) -> None:
    manager = PersistentStateManager(settings=settings)
    user = uid("u")
    manager.save_user_state(user, {"memories": ["tea"]})
    assert redis_client.exists(keys.user_state_cache(user))
    redis_client.flushdb()
    assert manager.load_user_state(user)["memories"] == ["tea"]  # from the database
    assert redis_client.exists(keys.user_state_cache(user))  # and backfilled


def test_an_older_revision_never_replaces_a_newer_one(
    redis_client: redis.Redis, redis_url: str
) -> None:
    cache = StateCache(redis_client, ttl_s=60)
    key = keys.user_state_cache(uid("u"))
    assert cache.put(key, 5, {"v": "new"})
    assert not cache.put(key, 4, {"v": "delayed old write"})
    assert cache.get(key) == (5, {"v": "new"})
    assert cache.put(key, 6, {"v": "newer"})
    assert cache.get(key) == (6, {"v": "newer"})


def test_entries_expire_with_their_ttl(redis_client: redis.Redis, redis_url: str) -> None:
    cache = StateCache(redis_client, ttl_s=1)
    key = keys.user_state_cache(uid("u"))
    cache.put(key, 1, {"a": 1})
    assert 0 < redis_client.ttl(key) <= 1
    time.sleep(1.2)
    assert cache.get(key) is None


def test_a_stale_cached_session_is_not_trusted(settings: Settings) -> None:
    backend = Backend.build(settings)
    store = SessionStore(backend.engine, backend.cache)
    snap = store.create(uid("s"), "alice")
    store.publish(snap)
    committed = store.commit(
        snap, SessionChange(phase="planning", status="active", doc=dict(snap.doc))
    )
    # A reader expecting revision 1 finds revision 0 in the cache: it reads the database.
    loaded = store.load(snap.session_id, expected_revision=1)
    assert loaded is not None and loaded.revision == committed.snapshot.revision == 1
    assert loaded.phase == "planning"


def test_redis_down_means_slower_not_wrong(settings: Settings) -> None:
    dead = make_settings(settings.database_url, redis_url="redis://127.0.0.1:1/0")
    manager = PersistentStateManager(settings=dead)
    user = uid("u")
    manager.save_user_state(user, {"still": "works"})
    assert manager.load_user_state(user)["still"] == "works"


def test_garbage_in_the_cache_is_a_miss(settings: Settings, redis_client: redis.Redis) -> None:
    manager = PersistentStateManager(settings=settings)
    user = uid("u")
    manager.save_user_state(user, {"ok": True})
    redis_client.hset(keys.user_state_cache(user), mapping={"rev": "99", "doc": "{not json"})
    assert manager.load_user_state(user)["ok"] is True


GARBAGE = {
    "a non-numeric revision": lambda r, key: r.hset(key, mapping={"rev": "garbage", "doc": "{}"}),
    "a key of another type": lambda r, key: r.set(key, "garbage"),
}


def test_a_cache_write_overwrites_an_unreadable_entry(redis_client: redis.Redis) -> None:
    cache = StateCache(redis_client, ttl_s=60)
    for plant in GARBAGE.values():
        key = keys.session_cache(uid("s"))
        plant(redis_client, key)
        assert cache.put(key, 3, {"fresh": True})
        assert cache.get(key) == (3, {"fresh": True})


def test_an_unreadable_entry_never_keeps_the_session_lock(
    pg_settings: Settings, redis_client: redis.Redis
) -> None:
    sync = DistributedStateSync(settings=pg_settings)
    for what, plant in GARBAGE.items():
        session_id = uid("s")
        cache_key = keys.session_cache(session_id)
        plant(redis_client, cache_key)
        handle, entry = sync.acquire(session_id, read_cache=True)  # a miss, not an error
        assert entry is None, what
        snap = sync.store.create(session_id, "u-1")
        sync.publish_and_release(handle, snap)
        assert not redis_client.exists(keys.session_lock(session_id)), what
        assert StateCache(redis_client, 60).get(cache_key) == (snap.revision, snap.to_cache())


def test_a_failed_cache_write_still_releases_the_lock(
    pg_settings: Settings, redis_client: redis.Redis
) -> None:
    # Whatever makes the write-and-release script fail, the lock must not outlive it.
    sync = DistributedStateSync(settings=pg_settings)
    session_id = uid("s")
    handle, _ = sync.acquire(session_id)
    snap = sync.store.create(session_id, "u-1")
    sync._put_and_release = redis_client.register_script("return redis.error_reply('boom')")
    sync.publish_and_release(handle, snap)
    assert not redis_client.exists(keys.session_lock(session_id))
