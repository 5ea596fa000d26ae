"""Helpers for the HTTP service's tests: a real ``agentstate serve`` with keys of its own,
clients that carry one key each, and a reader of Server-Sent Events."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from config import Settings
from tasks.worker.processes import ApiServer, free_port
from tests.support import settings_env

T = TypeVar("T")
READY_S = 90.0


def new_keys(*users: str) -> dict[str, str]:
    """A fresh random key per user (``"*"``: an operator)."""
    return {user: f"k{secrets.token_urlsafe(24)}" for user in users}


def keys_value(keys: dict[str, str]) -> str:
    """AGENTSTATE_API_KEYS for ``keys`` (user -> key)."""
    return ",".join(f"{key}:{user}" for user, key in keys.items())


@dataclass
class Api:
    """A running ``agentstate serve`` and its keys."""

    url: str
    keys: dict[str, str]
    server: ApiServer
    log: Path
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self, user: str | None = None, **headers: str) -> httpx.Client:
        """A client with ``user``'s key (None: no Authorization header)."""
        sent = dict(headers)
        if user is not None:
            sent["Authorization"] = f"Bearer {self.keys[user]}"
        made = httpx.Client(base_url=self.url, headers=sent, timeout=30.0)
        self.clients.append(made)
        return made

    def close(self) -> None:
        for made in self.clients:
            made.close()


@contextmanager
def serving(
    settings: Settings, log_dir: Path, keys: dict[str, str] | None, **env: str
) -> Iterator[Api]:
    """``agentstate serve`` for ``settings`` with ``keys`` (None: no keys), until the
    block ends; it must then stop cleanly on SIGTERM (exit 0)."""
    environment = settings_env(settings)
    if keys:
        environment["AGENTSTATE_API_KEYS"] = keys_value(keys)
    environment.update(env)
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    server = ApiServer(settings, port, log=log, env=environment)
    api = Api(server.url, keys or {}, server, log)
    try:
        assert server.wait_ready(READY_S), f"agentstate serve did not start:\n{read(log)}"
        yield api
    finally:
        api.close()
        status = server.stop()
    assert status == 0, f"agentstate serve exited {status}:\n{read(log)}"


def read(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else ""


def wait_for(probe: Callable[[], T | None], timeout: float = 60.0, what: str = "it") -> T:
    """Call ``probe`` until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def replied(client: httpx.Client, session_id: str, replies: int = 1) -> dict[str, Any] | None:
    """The session once it rests with ``replies`` assistant messages, else None."""
    answer = client.get(f"/v1/sessions/{session_id}")
    if answer.status_code != 200:
        return None
    doc: dict[str, Any] = answer.json()
    count = sum(item["role"] == "assistant" for item in doc["message_history"])
    if count >= replies and doc["queued"] == 0 and doc["phase"] in ("idle", "clarifying"):
        return doc
    return None


@dataclass
class Sse:
    """One Server-Sent Events message."""

    id: str | None
    data: dict[str, Any] | None
    comment: str | None = None


def sse_messages(response: httpx.Response) -> Iterator[Sse]:
    """The messages (and comments) of an SSE response, as they arrive."""
    event_id: str | None = None
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith(":"):
            yield Sse(None, None, line[1:].strip())
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield Sse(event_id, json.loads("\n".join(data)))
            event_id, data = None, []


def follow(
    client: httpx.Client,
    session_id: str,
    until: Callable[[dict[str, Any]], bool],
    headers: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
) -> list[Sse]:
    """The stream's messages up to the first whose event ``until`` accepts."""
    seen: list[Sse] = []
    with client.stream(
        "GET", f"/v1/sessions/{session_id}/events", headers=headers or {}, params=params or {}
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for message in sse_messages(response):
            if message.data is None:
                continue
            seen.append(message)
            if until(message.data):
                break
    return seen
