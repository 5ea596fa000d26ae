"""The Redis state lock (seed: DistributedStateSync), fenced by the database.

Each acquisition gets a unique token; release and renewal compare the token first (Lua),
so a holder can never free or extend someone else's lock. The lock only saves wasted
work: correctness comes from the guarded write, and a holder checks it still holds the
lock right before committing, so a lock that expired, was stolen or was flushed makes
the write fail with StaleStateError instead of landing.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from config import Settings, get_settings
from state.documents import codec
from state.documents.codec import Document
from state.errors import CorruptStateError, InvalidPayloadError, StateLockAcquisitionError
from state.ids import validate_id
from state.machine import STATES, Phase
from state.migrate import stamp
from state.session import ROLES, SessionState, SessionStatus
from state.sessions.rows import full_document, new_document
from state.sessions.snapshot import SessionChange, Snapshot
from state.sessions.store import SessionStore
from state.storage import keys
from state.storage.backend import Backend
from state.storage.cache import CachedEntry, decode_entry
from state.storage.redis_client import (
    ACQUIRE,
    ACQUIRE_AND_READ,
    CACHE_PUT_AND_PUSH,
    CACHE_PUT_AND_RELEASE,
    RELEASE,
    RENEW,
)
from state.ticker import Ticker

__all__ = ["DistributedStateSync", "LockHandle", "StateLockAcquisitionError"]

logger = logging.getLogger(__name__)

DEFAULT_RETRY_BASE_DELAY_S = 0.002
# A short ceiling keeps long waiters polling often, so newcomers cannot starve them.
DEFAULT_RETRY_MAX_DELAY_S = 0.02


@dataclass
class LockHandle:
    """One acquisition of a session's lock."""

    session_id: str
    key: str
    token: str
    ttl_ms: int
    lost: bool = False
    # When Redis last confirmed the lock is ours (acquisition or renewal), monotonic.
    confirmed_at: float = field(default_factory=time.monotonic)


_renewer = Ticker("lock-renewer")


class DistributedStateSync:
    """Serializes updates of one session across processes and machines."""

    def __init__(
        self,
        redis_client: redis.Redis | None = None,
        store: SessionStore | None = None,
        *,
        settings: Settings | None = None,
        lock_timeout: float | None = None,
        max_retries: int | None = None,
        acquire_timeout_s: float | None = None,
        retry_base_delay_s: float = DEFAULT_RETRY_BASE_DELAY_S,
        retry_max_delay_s: float = DEFAULT_RETRY_MAX_DELAY_S,
    ) -> None:
        settings = settings or get_settings()
        if store is None:
            backend = Backend.build(settings, redis_client=redis_client)
            store = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
        self.redis = redis_client or store.cache.redis
        self.store = store
        self.lock_timeout = lock_timeout if lock_timeout is not None else settings.lock_timeout
        self.max_retries = max_retries
        # By default wait at most one TTL: by then a crashed holder's lock has expired,
        # and a live holder that keeps renewing is not worth waiting for any longer.
        self.acquire_timeout_s = (
            acquire_timeout_s if acquire_timeout_s is not None else self.lock_timeout
        )
        # Whether a commit's cache write also wakes the session's event followers.
        self.push = settings.events
        self.retry_base_delay_s = retry_base_delay_s
        self.retry_max_delay_s = retry_max_delay_s
        self._held: dict[tuple[str, str], str] = {}
        self._acquire = self.redis.register_script(ACQUIRE)
        self._acquire_and_read = self.redis.register_script(ACQUIRE_AND_READ)
        self._release = self.redis.register_script(RELEASE)
        self._renew = self.redis.register_script(RENEW)
        self._put_and_release = self.redis.register_script(CACHE_PUT_AND_RELEASE)
        self._put_and_push = self.redis.register_script(CACHE_PUT_AND_PUSH)

    @property
    def ttl_ms(self) -> int:
        """The lock's time to live in milliseconds."""
        return max(1, int(self.lock_timeout * 1000))

    # -- the seed's primitives ------------------------------------------------

    def acquire_state_lock(self, session_id: str, node_id: str | None = None) -> str | None:
        """Try once; return this acquisition's token, or None if the lock is held."""
        token = _new_token(node_id)
        if not self._acquire(keys=[keys.session_lock(session_id)], args=[token, self.ttl_ms]):
            return None
        if node_id is not None:
            self._held[(session_id, node_id)] = token
        logger.debug("state lock acquired for %s", session_id)
        return token

    def release_state_lock(self, session_id: str, token: str) -> bool:
        """Release if ``token`` (or this object's acquisition for that node id) holds it."""
        token = self._held.pop((session_id, token), token)
        return bool(self._release(keys=[keys.session_lock(session_id)], args=[token]))

    def release_key(self, key: str, token: str) -> bool:
        """Compare-and-delete any lock key agentstate owns (the sweep lock, say)."""
        try:
            return bool(self._release(keys=[key], args=[token]))
        except redis.RedisError:
            return False

    def renew_state_lock(self, session_id: str, token: str) -> bool:
        """Extend the lock's TTL if ``token`` still holds it."""
        token = self._held.get((session_id, token), token)
        return bool(self._renew(keys=[keys.session_lock(session_id)], args=[token, self.ttl_ms]))

    def current_holder(self, session_id: str) -> str | None:
        """The token holding the session's lock, if any (None also if Redis is down)."""
        try:
            value = self.redis.get(keys.session_lock(session_id))
        except redis.RedisError:
            return None
        return value.decode() if isinstance(value, bytes) else value

    # -- acquisition with retries ----------------------------------------------

    def acquire(
        self,
        session_id: str,
        *,
        node_id: str | None = None,
        read_cache: bool = False,
        timeout_s: float | None = None,
    ) -> tuple[LockHandle, CachedEntry | None]:
        """Acquire with jittered exponential backoff, bounded by ``max_retries`` (if set)
        and by ``timeout_s`` (default ``acquire_timeout_s``); also read the cache if asked."""
        key = keys.session_lock(session_id)
        budget = self.acquire_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        attempt = 0
        while True:
            handle = LockHandle(session_id, key, _new_token(node_id), self.ttl_ms)
            acquired, entry = self._try_acquire(handle, read_cache)
            if acquired:
                return handle, entry
            attempt += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.max_retries is not None and attempt > self.max_retries):
                raise StateLockAcquisitionError(
                    f"could not lock session {session_id} after {attempt} attempts "
                    f"in {budget - max(remaining, 0):.1f}s"
                )
            ceiling = min(self.retry_max_delay_s, self.retry_base_delay_s * 2**attempt, remaining)
            time.sleep(random.uniform(0, ceiling))

    def _try_acquire(self, handle: LockHandle, read_cache: bool) -> tuple[bool, CachedEntry | None]:
        if not read_cache:
            return bool(self._acquire(keys=[handle.key], args=[handle.token, handle.ttl_ms])), None
        cache_key = keys.session_cache(handle.session_id)
        try:
            reply = self._acquire_and_read(
                keys=[handle.key, cache_key], args=[handle.token, handle.ttl_ms]
            )
        except redis.ResponseError as exc:
            # The script failed, perhaps after taking the lock: free it (it is ours if it
            # was taken) and take it without the cache.
            logger.warning(
                "lock-and-read of %s failed; locking without the cache: %s", cache_key, exc
            )
            self._release(keys=[handle.key], args=[handle.token])
            return bool(self._acquire(keys=[handle.key], args=[handle.token, handle.ttl_ms])), None
        if not reply[0]:
            return False, None
        return True, decode_entry(cache_key, reply[1], reply[2])

    @contextmanager
    def locked(self, session_id: str, *, renew: bool = True) -> Iterator[LockHandle]:
        """Hold the session's lock for the block (renewed in the background if ``renew``)."""
        handle, _ = self.acquire(session_id)
        try:
            if renew:
                self.keep_renewed(handle)
            yield handle
        finally:
            self.release(handle)

    def still_held(self, handle: LockHandle) -> bool:
        """Ask Redis (and extend the lock) right before a commit."""
        if handle.lost:
            return False
        try:
            held = bool(self._renew(keys=[handle.key], args=[handle.token, handle.ttl_ms]))
        except redis.RedisError:
            held = False
        handle.lost = not held
        if held:
            handle.confirmed_at = time.monotonic()
        return held

    def surely_held(self, handle: LockHandle) -> bool:
        """Like still_held, without a round trip while less than half the TTL has passed
        since Redis last confirmed the lock (a lease: it cannot have expired yet). A lock
        deleted early by hand is then noticed by the revision guard instead."""
        if handle.lost:
            return False
        if time.monotonic() - handle.confirmed_at < handle.ttl_ms / 2000.0:
            return True
        return self.still_held(handle)

    def keep_renewed(self, handle: LockHandle) -> None:
        """Renew ``handle`` in the background (every third of its TTL) until released."""
        _renewer.register(handle.token, handle.ttl_ms / 3000.0, lambda: self._renew_once(handle))

    def _renew_once(self, handle: LockHandle) -> bool:
        try:
            held = bool(self._renew(keys=[handle.key], args=[handle.token, handle.ttl_ms]))
        except redis.RedisError as exc:
            logger.warning("renewing lock %s failed, will retry: %s", handle.key, exc)
            return True
        if not held:
            handle.lost = True
            logger.warning("lock %s was lost while held; its write will be refused", handle.key)
        else:
            handle.confirmed_at = time.monotonic()
        return held

    def release(self, handle: LockHandle) -> bool:
        """Release ``handle`` (compare-and-delete); False if it was no longer ours."""
        _renewer.unregister(handle.token)
        try:
            return bool(self._release(keys=[handle.key], args=[handle.token]))
        except redis.RedisError as exc:
            logger.warning("releasing %s failed; it expires on its own: %s", handle.key, exc)
            return False

    def publish(self, snapshot: Snapshot, payload: str | None = None) -> None:
        """Write a snapshot committed without the lock to the cache and wake the session's
        event followers, in one round trip (``payload``: its cache form, if encoded)."""
        cache_key = keys.session_cache(snapshot.session_id)
        payload = payload if payload is not None else codec.dumps(snapshot.to_cache())
        channel = keys.session_events(snapshot.session_id) if self.push else ""
        try:
            self._put_and_push(
                keys=[cache_key],
                args=[snapshot.revision, payload, self.store.cache.ttl_s, channel],
            )
        except redis.RedisError as exc:
            # The next reader must not trust an older entry: drop it (it reads the row).
            logger.warning("cache write for %s failed: %s", snapshot.session_id, exc)
            self.store.cache.evict(cache_key)

    def publish_and_release(
        self, handle: LockHandle, snapshot: Snapshot, payload: str | None = None
    ) -> None:
        """Write the committed snapshot to the cache, wake the session's event followers
        and release, in one round trip (``payload``: its cache form, if encoded)."""
        _renewer.unregister(handle.token)
        cache_key = keys.session_cache(snapshot.session_id)
        payload = payload if payload is not None else codec.dumps(snapshot.to_cache())
        channel = keys.session_events(snapshot.session_id) if self.push else ""
        try:
            self._put_and_release(
                keys=[cache_key, handle.key],
                args=[snapshot.revision, payload, self.store.cache.ttl_s, handle.token, channel],
            )
        except redis.RedisError as exc:
            # A failed cache write must never keep the lock: release it on its own, and
            # drop whatever the cache holds (the next reader goes to the database).
            logger.warning("cache write/release for %s failed: %s", snapshot.session_id, exc)
            self.release(handle)
            self.store.cache.evict(cache_key)

    # -- the seed's atomic update ---------------------------------------------

    def update_state_atomic(
        self,
        session_id: str,
        update_fn: Callable[[Document], Document | None],
        node_id: str | None = None,
    ) -> Document:
        """Lock, load (migrated), apply ``update_fn``, save guarded, release.

        ``update_fn`` gets the full session document (history included) and returns the
        new one (or mutates it and returns None). It is not called if the lock cannot be
        acquired; StaleStateError means the lock was lost and nothing was written.
        """
        validate_id(session_id, "session")
        handle, _ = self.acquire(session_id, node_id=node_id)
        published = False
        try:
            snapshot = self.store.load_from_database(session_id) or _unsaved(session_id)
            # (A fork starts at revision 0 with a history: count messages, not revisions.)
            history = self.store.history(session_id) if snapshot.message_count else []
            current = full_document(snapshot, history)
            proposed = update_fn(copy.deepcopy(current))
            change = _change_from(current, current if proposed is None else proposed)
            result = self.store.commit(snapshot, change, lambda: self.still_held(handle))
            self.publish_and_release(handle, result.snapshot)
            published = True
            return full_document(result.snapshot, history + change.new_messages)
        finally:
            if not published:
                self.release(handle)


def _new_token(node_id: str | None) -> str:
    return f"{node_id or 'node'}:{os.getpid()}:{uuid.uuid4().hex}"


def _unsaved(session_id: str) -> Snapshot:
    doc = new_document(session_id, "")
    return Snapshot(session_id, "", Phase.IDLE, SessionStatus.ACTIVE, 0, doc, 0, stored=False)


def _change_from(current: Document, proposed: object) -> SessionChange:
    if not isinstance(proposed, dict):
        raise InvalidPayloadError("update_fn must return the state as a JSON object")
    doc = stamp(copy.deepcopy(proposed))
    codec.require_storable(doc, "the new state")
    history = doc.pop("message_history", current["message_history"])
    old_history = current["message_history"]
    if not isinstance(history, list) or history[: len(old_history)] != old_history:
        raise InvalidPayloadError("message_history is append-only: only add items at the end")
    phase = doc.get("phase", current["phase"])
    if phase not in STATES:
        raise InvalidPayloadError(f"phase must be one of the FSM states, got {phase!r}")
    for derived in ("revision", "session_id"):
        doc.pop(derived, None)
    doc["session_id"] = current["session_id"]
    new_messages = history[len(old_history) :]
    _check_shape(doc, new_messages)
    return SessionChange(
        phase=phase,
        status=str(doc.get("status", current["status"])),
        doc=doc,
        new_messages=new_messages,
        trigger="update",
    )


def _check_shape(doc: Document, new_messages: list[Any]) -> None:
    """Refuse a document that the next load would have to quarantine."""
    try:
        SessionState.from_document({**doc, "message_history": new_messages})
    except CorruptStateError as exc:
        raise InvalidPayloadError(f"not a valid session state: {exc}") from exc
    for item in new_messages:
        if not isinstance(item, dict) or item.get("role") not in ROLES:
            raise InvalidPayloadError(f"history items need a role among {ROLES}: {item!r:.80}")
        if not isinstance(item.get("content", ""), str):
            raise InvalidPayloadError("a history item's content must be a string")
