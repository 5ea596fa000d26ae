"""In-process baselines timed warm: N processes get ready, then one clock times the runs.

Each process imports its library, builds what it needs (graphs, pools, connections) and
runs a warm-up turn, all before the clock; then every process waits at one barrier with
the parent. The clock starts when the barrier opens and stops when the last process has
finished its share, so Python's start-up and the library's import are never timed.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

READY_TIMEOUT_S = 180.0
RUN_TIMEOUT_S = 900.0

# ``prepare(*args)`` builds everything and returns the run (timed) and the clean-up.
Prepared = tuple[Callable[[], None], Callable[[], None]]


def _child(target: str, args: tuple[Any, ...], barrier: Any, out: Any) -> None:
    try:
        module, name = target.split(":")
        prepare = getattr(importlib.import_module(module), name)
        run, close = prepare(*args)
    except BaseException:
        out.put(("error", traceback.format_exc()))
        barrier.abort()
        return
    try:
        barrier.wait(READY_TIMEOUT_S)
        run()
        out.put(("done", time.monotonic()))
    except BaseException:
        out.put(("error", traceback.format_exc()))
    finally:
        close()


def run_warm(target: str, shares: list[tuple[Any, ...]]) -> float:
    """Seconds from the start barrier until every process finished its share.

    ``target`` is ``"module:prepare"``; process ``i`` calls ``prepare(*shares[i])``.
    ``time.monotonic`` is one clock for every process of the machine (Linux).
    """
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(shares) + 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(target, share, barrier, out)) for share in shares]
    for proc in procs:
        proc.start()
    try:
        try:
            barrier.wait(READY_TIMEOUT_S)
        except Exception:
            raise RuntimeError(f"{target} did not get ready: {_first_error(out)}") from None
        started = time.monotonic()
        ends = []
        for _ in procs:
            kind, value = out.get(timeout=RUN_TIMEOUT_S)
            if kind == "error":
                raise RuntimeError(f"{target} failed:\n{value}")
            ends.append(value)
        return max(ends) - started
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()


@contextmanager
def one_at_a_time(url: str, key: int) -> Iterator[None]:
    """Hold a Postgres advisory lock (a library's schema set-up, run by every process).

    Waiting polls ``pg_try_advisory_lock``: a session blocked in ``pg_advisory_lock`` is an
    open transaction, which a ``CREATE INDEX CONCURRENTLY`` in the holder's set-up waits
    for (a deadlock).
    """
    import psycopg

    deadline = time.monotonic() + READY_TIMEOUT_S
    with psycopg.connect(url, autocommit=True) as conn:
        while not _try_lock(conn, key):
            if time.monotonic() > deadline:
                raise TimeoutError(f"advisory lock {key} not free within {READY_TIMEOUT_S:g}s")
            time.sleep(0.05)
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _try_lock(conn: Any, key: int) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
    return bool(row and row[0])


def _first_error(out: Any) -> str:
    try:
        _kind, value = out.get(timeout=5)
    except Exception:
        return "no error reported (timed out at the barrier)"
    return str(value)
