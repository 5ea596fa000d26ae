"""Benchmarks of the HTTP service (``agentstate serve``):

- turns/s sent and answered through the HTTP API vs through the Python client, on the
  same workers, the two taking turns (what the HTTP hop, JSON and the thread the
  service calls the client in cost a turn);
- concurrent event streams (SSE) one serve process holds, and its resident memory per
  stream: every follower receives the same reply, which shows they are all alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench import harness
from bench.harness import say
from bench.rows import Row, send_turns
from bench.suite import SHAPE, sized
from config import Settings, child_environment
from tasks.client import AgentClient
from tasks.worker.processes import ApiServer, free_port

FOLLOWERS_FULL = 1000
STREAMS_HEADROOM = 64


def _serve(settings: Settings, **env: str) -> ApiServer:
    log = Path(tempfile.mkdtemp(prefix="agentstate-bench-serve-")) / "serve.log"
    environment = {**child_environment(settings), **env}
    server = ApiServer(settings, free_port(), log=log, env=environment)
    if not server.wait_ready(120):
        raise RuntimeError(f"agentstate serve did not start; see {log}")
    return server


# -- turns through HTTP ------------------------------------------------------------------


def http_turns(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Turns/s through POST /v1/sessions/{id}/messages vs AgentClient.send_message."""
    sessions, per = sized(40, scale, 4), sized(5, scale, 2)
    rounds = sized(3, scale, 1)
    settings = harness.bench_settings()
    results: dict[str, list[float]] = {"http": [], "client": []}
    accept: dict[str, list[float]] = {"http": [], "client": []}
    with harness.workers(settings, **SHAPE):
        server = _serve(settings)
        try:
            with httpx.Client(base_url=server.url, timeout=60) as web:
                client = AgentClient(settings)
                _http_round(web, "warm", 4, 2)  # imports, pools, caches
                send_turns(client, f"warm-{uuid.uuid4().hex[:6]}", 4, 2)
                for n in range(rounds):
                    order = ["http", "client"] if n % 2 == 0 else ["client", "http"]
                    for side in order:
                        if side == "http":
                            rate, took = _http_round(web, f"h{n}", sessions, per)
                        else:
                            rate, took = _client_round(client, f"c{n}", sessions, per)
                        results[side].append(rate)
                        accept[side].extend(took)
                    rates = f"http {results['http'][-1]:.1f}, client {results['client'][-1]:.1f}"
                    say(f"{rates} turns/s")
        finally:
            server.stop()
    table.append(
        Row(
            "turns/s sent over HTTP (serve) vs the Python client",
            max(results["http"]),
            max(results["client"]),
            "turns/s",
            "AgentClient.send_message",
            target=">= 0.9x",
        )
    )
    table.append(
        Row(
            "message accepted p50, HTTP vs the Python client",
            statistics.median(accept["http"]) * 1000,
            statistics.median(accept["client"]) * 1000,
            "ms",
            "AgentClient.send_message",
            higher_is_better=False,
            target="report",
        )
    )
    notes.append(
        f"HTTP turns: {sessions} sessions x {per} messages, sent one after the other (one "
        f"keep-alive connection, or one client), until all are answered; the best of "
        f"{rounds} rounds each, the two sides taking turns on the same workers."
    )


def _http_round(web: httpx.Client, tag: str, sessions: int, per: int) -> tuple[float, list[float]]:
    ids = [f"web-{tag}-{uuid.uuid4().hex[:6]}-{i}" for i in range(sessions)]
    took: list[float] = []
    harness.analyze()
    started = time.perf_counter()
    for k in range(per):
        for session_id in ids:
            sent = time.perf_counter()
            answer = web.post(
                f"/v1/sessions/{session_id}/messages",
                json={"text": f"hello number {k}", "user_id": "bench-user"},
            )
            took.append(time.perf_counter() - sent)
            answer.raise_for_status()
    total = sessions * per
    harness.wait_until(lambda: harness.answered(ids) >= total, 600, f"{total} turns")
    return total / (time.perf_counter() - started), took


def _client_round(
    client: AgentClient, tag: str, sessions: int, per: int
) -> tuple[float, list[float]]:
    took: list[float] = []
    original = client.send_message

    def timed(*a: Any, **k: Any) -> str:
        sent = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            took.append(time.perf_counter() - sent)

    client.send_message = timed  # type: ignore[method-assign]
    try:
        rate = send_turns(client, f"py-{tag}-{uuid.uuid4().hex[:6]}", sessions, per)
    finally:
        client.send_message = original  # type: ignore[method-assign]
    return rate, took


# -- event streams held ------------------------------------------------------------------


def followers(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Open streams one serve process holds, and its memory per stream."""
    count = sized(FOLLOWERS_FULL, scale, 4)
    settings = harness.bench_settings()
    with harness.workers(settings, **SHAPE):
        server = _serve(
            settings,
            AGENTSTATE_MAX_STREAMS=str(count + STREAMS_HEADROOM),
            AGENTSTATE_STREAM_MAX_SECONDS="3600",
        )
        try:
            client = AgentClient(settings)
            session_id = f"followed-{uuid.uuid4().hex[:8]}"
            client.send_message(session_id, "hello", user_id="bench-user")
            client.wait_for_idle(session_id, timeout=60)
            seq = list(client.events(session_id))[-1]["seq"]
            before = harness.rss_kib([server.proc.pid])
            result = asyncio.run(
                _hold(server.port, session_id, seq, count, client=client, server=server)
            )
        finally:
            server.stop()
    held, after, fanout = result
    per = (after - before) / max(held, 1)
    say(f"{held}/{count} streams held; RSS {before} -> {after} KiB; reply to all in {fanout:.2f}s")
    table.append(
        Row(
            "event streams held by one serve process",
            held,
            count,
            "streams",
            f"{count} opened",
            target="all",
            check=held == count,
        )
    )
    table.append(
        Row(
            "serve RSS per open event stream",
            per,
            before,
            "KiB",
            "serve RSS with no stream",
            higher_is_better=False,
            target="report",
        )
    )
    table.append(
        Row(
            f"a reply reaching all {count} streams",
            fanout * 1000,
            1.0,
            "ms",
            "-",
            higher_is_better=False,
            target="report",
        )
    )
    notes.append(
        f"event streams: {count} SSE connections to one `agentstate serve`, all following "
        "one session; RSS read once all are open; then one message, and the time until "
        "every stream has its reply. Each stream is a coroutine of AsyncAgentClient's "
        "follower, woken through the process's shared Redis subscription: no thread per stream."
    )


async def _hold(
    port: int,
    session_id: str,
    after: int,
    count: int,
    *,
    client: AgentClient,
    server: ApiServer,
) -> tuple[int, int, float]:
    opened = asyncio.Event()
    ready: list[int] = []
    got_reply: list[float] = []
    done = asyncio.Event()

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /v1/sessions/{session_id}/events?after={after} HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            writer.close()
            return
        ready.append(1)
        if len(ready) == count:
            opened.set()
        try:
            while not done.is_set():
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b"data:") and b'"kind":"reply"' in line:
                    json.loads(line[5:])
                    got_reply.append(time.perf_counter())
                    if len(got_reply) == count:
                        done.set()
                    return
        finally:
            writer.close()

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    with contextlib.suppress(TimeoutError):  # some never opened: the row says how many
        await asyncio.wait_for(opened.wait(), timeout=300)
    await asyncio.sleep(2.0)  # every stream's first wait has begun
    rss = harness.rss_kib([server.proc.pid])
    sent = time.perf_counter()
    await asyncio.to_thread(client.send_message, session_id, "hello again", user_id="bench-user")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout=300)
    fanout = (max(got_reply) - sent) if got_reply else float("nan")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return len(got_reply), rss, fanout
