"""The fenced Redis lock and update_state_atomic, with real processes on real services."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any

import pytest
import redis

from config import Settings
from state.errors import StaleStateError, StateLockAcquisitionError
from state.lock import DistributedStateSync
from state.storage import keys
from tests.support import make_settings, uid

PROCESSES = 8
INCREMENTS = 500


def _increment(doc: dict[str, Any]) -> dict[str, Any]:
    metadata = doc["metadata"]
    metadata["count"] = metadata.get("count", 0) + 1
    return doc


def _count_worker(database_url: str, session_id: str, n: int, out: Any) -> None:
    sync = DistributedStateSync(settings=make_settings(database_url))
    for _ in range(n):
        sync.update_state_atomic(session_id, _increment)
    out.put(os.getpid())


def _count(sync: DistributedStateSync, session_id: str) -> int:
    snap = sync.store.load_from_database(session_id)
    return 0 if snap is None else int(snap.doc["metadata"].get("count", 0))


def test_eight_processes_times_500_increments_is_exactly_4000(
    pg_settings: Settings, record_property: Any
) -> None:
    session_id = uid("count")
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    procs = [
        ctx.Process(
            target=_count_worker, args=(pg_settings.database_url, session_id, INCREMENTS, done)
        )
        for _ in range(PROCESSES)
    ]
    started = time.perf_counter()
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    elapsed = time.perf_counter() - started
    assert all(proc.exitcode == 0 for proc in procs), [p.exitcode for p in procs]
    sync = DistributedStateSync(settings=pg_settings)
    assert _count(sync, session_id) == PROCESSES * INCREMENTS
    snap = sync.store.load_from_database(session_id)
    assert snap is not None and snap.revision == PROCESSES * INCREMENTS
    record_property("lock_4000_seconds", round(elapsed, 2))
    print(f"\n8x500 update_state_atomic: {elapsed:.1f}s ({4000 / elapsed:.0f} updates/s)")


def _slow_holder(database_url: str, session_id: str, pause_s: float, out: Any) -> None:
    sync = DistributedStateSync(settings=make_settings(database_url), lock_timeout=1.0)

    def slow(doc: dict[str, Any]) -> dict[str, Any]:
        out.put("in-fn")
        time.sleep(pause_s)  # the lock (1 s TTL) expires while we sleep
        return _increment(doc)

    try:
        sync.update_state_atomic(session_id, slow)
        out.put("committed")
    except StaleStateError:
        out.put("stale")


def test_a_holder_paused_past_its_ttl_cannot_commit(settings: Settings) -> None:
    session_id = uid("paused")
    sync = DistributedStateSync(settings=settings, lock_timeout=1.0)
    sync.update_state_atomic(session_id, _increment)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_slow_holder, args=(settings.database_url, session_id, 2.5, out))
    proc.start()
    assert out.get(timeout=30) == "in-fn"
    sync.update_state_atomic(session_id, _increment)  # gets in once the TTL lapses
    proc.join(timeout=30)
    assert out.get(timeout=5) == "stale"
    assert _count(sync, session_id) == 2


def _stoppable_holder(database_url: str, session_id: str, out: Any) -> None:
    sync = DistributedStateSync(settings=make_settings(database_url), lock_timeout=1.0)

    def work(doc: dict[str, Any]) -> dict[str, Any]:
        out.put(os.getpid())
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # busy: SIGSTOP freezes us mid-update
            pass
        return _increment(doc)

    try:
        sync.update_state_atomic(session_id, work)
        out.put("committed")
    except StaleStateError:
        out.put("stale")


def test_a_sigstopped_holder_is_refused_after_sigcont(pg_settings: Settings) -> None:
    session_id = uid("sigstop")
    sync = DistributedStateSync(settings=pg_settings, lock_timeout=1.0)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_stoppable_holder, args=(pg_settings.database_url, session_id, out))
    proc.start()
    pid = out.get(timeout=30)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.5)  # past the holder's TTL
        sync.update_state_atomic(session_id, _increment)
    finally:
        os.kill(pid, signal.SIGCONT)
    proc.join(timeout=30)
    assert out.get(timeout=5) == "stale"
    assert _count(sync, session_id) == 1


def test_releasing_with_a_foreign_token_deletes_nothing(
    settings: Settings, redis_client: redis.Redis
) -> None:
    sync = DistributedStateSync(settings=settings)
    session_id = uid("s")
    token = sync.acquire_state_lock(session_id, "node-a")
    assert token
    assert sync.acquire_state_lock(session_id, "node-a") is None  # not re-entrant
    assert sync.release_state_lock(session_id, "someone-else") is False
    assert redis_client.get(keys.session_lock(session_id)) == token.encode()
    assert sync.release_state_lock(session_id, token) is True
    assert redis_client.get(keys.session_lock(session_id)) is None


def test_two_processes_on_one_node_never_share_a_lock(settings: Settings) -> None:
    first = DistributedStateSync(settings=settings)
    second = DistributedStateSync(settings=settings)
    session_id = uid("s")
    assert first.acquire_state_lock(session_id, "same-node")
    assert second.acquire_state_lock(session_id, "same-node") is None


def test_exhausted_retries_raise_without_calling_fn(settings: Settings) -> None:
    holder = DistributedStateSync(settings=settings)
    session_id = uid("busy")
    assert holder.acquire_state_lock(session_id)
    sync = DistributedStateSync(settings=settings, max_retries=3, retry_max_delay_s=0.01)
    calls: list[int] = []
    with pytest.raises(StateLockAcquisitionError):
        sync.update_state_atomic(session_id, lambda doc: calls.append(1) or doc)
    assert calls == []
    assert sync.store.load_from_database(session_id) is None  # nothing was written


def test_renewal_keeps_a_long_holder_locked(settings: Settings, redis_client: redis.Redis) -> None:
    sync = DistributedStateSync(settings=settings, lock_timeout=0.6)
    other = DistributedStateSync(settings=settings, max_retries=0)
    session_id = uid("long")
    with sync.locked(session_id, renew=True) as handle:
        time.sleep(2.0)  # more than three TTLs
        assert other.acquire_state_lock(session_id) is None
        assert sync.still_held(handle)
    assert redis_client.get(keys.session_lock(session_id)) is None


def test_a_flushed_lock_makes_the_write_fail(settings: Settings, redis_client: redis.Redis) -> None:
    sync = DistributedStateSync(settings=settings)
    session_id = uid("flushed")

    def flush_midway(doc: dict[str, Any]) -> dict[str, Any]:
        redis_client.flushdb()  # locks and cache gone, as after a Redis restart
        return _increment(doc)

    with pytest.raises(StaleStateError):
        sync.update_state_atomic(session_id, flush_midway)
    assert sync.store.load_from_database(session_id) is None


def test_update_state_atomic_keeps_history_append_only(settings: Settings) -> None:
    from state.errors import InvalidPayloadError

    sync = DistributedStateSync(settings=settings)
    session_id = uid("hist")

    def say(doc: dict[str, Any]) -> dict[str, Any]:
        doc["message_history"].append(
            {"role": "user", "content": "hi", "timestamp": "t", "metadata": {}}
        )
        return doc

    state = sync.update_state_atomic(session_id, say)
    assert [m["content"] for m in state["message_history"]] == ["hi"]
    with pytest.raises(InvalidPayloadError):
        sync.update_state_atomic(session_id, lambda doc: {**doc, "message_history": []})
    assert len(sync.store.history(session_id)) == 1
