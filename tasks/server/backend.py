"""The one place the HTTP service reaches agentstate: the asyncio client the routes call.

Every route calls :class:`tasks.client.AsyncAgentClient` (ARCHITECTURE part 3): its hot
calls (sending, reading a session, following events) run on the event loop without a
thread, so an open event stream costs a coroutine and a Redis subscription, not a thread.
Each call names ``user_id`` (the key's user, or None for an operator key).
"""

from __future__ import annotations

from config import Settings
from tasks.client.aio import AsyncAgentClient


def open_client(settings: Settings) -> AsyncAgentClient:
    """The client of one serve process (each worker process of gunicorn opens its own
    connections on first use: the client notices a fork)."""
    return AsyncAgentClient(settings)
