"""The OpenAI Agents SDK's ``Session`` on an agentstate session (extra ``openai-agents``).

``AgentstateSession(session_id, user_id, client=None)`` is what ``Runner.run(agent,
text, session=...)`` reads the conversation from and writes each turn's items to. The
items are the agentstate session's history (``state.sessions.items``): the console shows
them, the event log tells each change, a fork shares them and ``erase_user`` deletes
them with the rest of the user's data. The session belongs to ``user_id``: another
user's object reads nothing and its writes raise ``NotFoundError``, changing nothing.

The SDK's methods are coroutines; the store is synchronous, so each call runs in a
thread (``asyncio.to_thread``), as ``AsyncAgentClient`` and the SDK's own SQLite session
do. Every item is a JSON object of at most ``AGENTSTATE_MAX_STEP_IO_BYTES``; a list with
one that is not is refused whole.

Tested with ``openai-agents`` 0.24.0.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from agents.memory.session_settings import SessionSettings, resolve_session_limit

from state.ids import validate_id
from state.sessions.items import SessionItems
from tasks.client.agent import AgentClient
from tasks.client.aio import AsyncAgentClient

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

SOURCE = "openai-agents"


class AgentstateSession:
    """The SDK's ``Session`` protocol (``get_items``, ``add_items``, ``pop_item``,
    ``clear_session``) on the agentstate session ``session_id`` of ``user_id``.

    ``client``: an ``AgentClient`` or ``AsyncAgentClient`` (default: ``AgentClient()``,
    which reads the ``AGENTSTATE_*`` settings). ``session_settings``: the SDK's
    ``SessionSettings`` (its ``limit`` is what ``get_items()`` reads without one).
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        user_id: str,
        client: AgentClient | AsyncAgentClient | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = validate_id(session_id, "session")
        self.user_id = validate_id(user_id, "user")
        self.session_settings = session_settings or SessionSettings()
        self._client = client
        self._items: SessionItems | None = None

    def _store(self) -> SessionItems:
        # Built on first use, in the calling thread: an AgentClient connects lazily.
        if self._items is None:
            client = self._client
            if client is None:
                client = AgentClient()
            elif isinstance(client, AsyncAgentClient):
                client = client._sync_client()
            self._items = SessionItems(
                client.sessions,
                client.notifier,
                max_item_bytes=client.settings.max_step_io_bytes,
                source=SOURCE,
            )
        return self._items

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation, oldest first: the newest ``limit`` items if given (else the
        session settings' ``limit``, else all). A turn's own messages (sent with
        ``send_message``) read as ``{"role", "content"}`` message items."""
        wanted = resolve_session_limit(limit, self.session_settings)
        items = await asyncio.to_thread(self._read, wanted)
        return cast("list[TResponseInputItem]", items)

    def _read(self, limit: int | None) -> list[dict[str, Any]]:
        return self._store().read(self.session_id, self.user_id, limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` to the session (created for ``user_id`` if it is new), in one
        commit: all of them or, on bad input, none."""
        # The store checks each item (a JSON object, storable, within the limit).
        await asyncio.to_thread(self._add, list(items))

    def _add(self, items: list[Any]) -> None:
        self._store().add(self.session_id, self.user_id, items)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (None if the session has none)."""
        item = await asyncio.to_thread(self._pop)
        return cast("TResponseInputItem | None", item)

    def _pop(self) -> dict[str, Any] | None:
        return self._store().pop(self.session_id, self.user_id)

    async def clear_session(self) -> None:
        """Remove every item of the session (the session itself stays, empty)."""
        await asyncio.to_thread(self._clear)

    def _clear(self) -> None:
        self._store().clear(self.session_id, self.user_id)
