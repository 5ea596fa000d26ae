"""Schedules and webhooks on ``AsyncAgentClient``: the sync client's methods in a thread
(rare writes and small reads, each one short transaction)."""

from __future__ import annotations

from typing import Any

from state.documents.codec import Document


class AsyncAutomation:
    """The schedules-and-webhooks part of AsyncAgentClient (``tasks.client.automation``)."""

    async def _in_thread(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # AsyncAgentClient's

    async def create_schedule(
        self, schedule_id: str, cron: str | None = None, **kwargs: Any
    ) -> Document:
        """``AgentClient.create_schedule``."""
        return await self._in_thread("create_schedule", schedule_id, cron, **kwargs)  # type: ignore[no-any-return]

    async def get_schedule(self, schedule_id: str, user_id: str | None = None) -> Document | None:
        """``AgentClient.get_schedule``."""
        return await self._in_thread("get_schedule", schedule_id, user_id=user_id)  # type: ignore[no-any-return]

    async def list_schedules(self, user_id: str | None = None) -> list[Document]:
        """``AgentClient.list_schedules``."""
        return await self._in_thread("list_schedules", user_id=user_id)  # type: ignore[no-any-return]

    async def pause_schedule(self, schedule_id: str, user_id: str | None = None) -> Document:
        """``AgentClient.pause_schedule``."""
        return await self._in_thread("pause_schedule", schedule_id, user_id=user_id)  # type: ignore[no-any-return]

    async def resume_schedule(self, schedule_id: str, user_id: str | None = None) -> Document:
        """``AgentClient.resume_schedule``."""
        return await self._in_thread("resume_schedule", schedule_id, user_id=user_id)  # type: ignore[no-any-return]

    async def delete_schedule(self, schedule_id: str, user_id: str | None = None) -> bool:
        """``AgentClient.delete_schedule``."""
        return bool(await self._in_thread("delete_schedule", schedule_id, user_id=user_id))

    async def schedule_runs(
        self, schedule_id: str, limit: int = 50, user_id: str | None = None
    ) -> list[Document]:
        """``AgentClient.schedule_runs``."""
        return await self._in_thread("schedule_runs", schedule_id, limit, user_id=user_id)  # type: ignore[no-any-return]

    async def add_webhook(self, url: str, events: list[str], **kwargs: Any) -> Document:
        """``AgentClient.add_webhook``."""
        return await self._in_thread("add_webhook", url, events, **kwargs)  # type: ignore[no-any-return]

    async def list_webhooks(self, user_id: str | None = None) -> list[Document]:
        """``AgentClient.list_webhooks``."""
        return await self._in_thread("list_webhooks", user_id=user_id)  # type: ignore[no-any-return]

    async def remove_webhook(self, webhook_id: str, user_id: str | None = None) -> bool:
        """``AgentClient.remove_webhook``."""
        return bool(await self._in_thread("remove_webhook", webhook_id, user_id=user_id))

    async def webhook_deliveries(
        self, webhook_id: str, limit: int = 50, user_id: str | None = None
    ) -> list[Document]:
        """``AgentClient.webhook_deliveries``."""
        return await self._in_thread("webhook_deliveries", webhook_id, limit, user_id=user_id)  # type: ignore[no-any-return]

    async def redeliver(self, delivery_id: str, user_id: str | None = None) -> Document:
        """``AgentClient.redeliver``."""
        return await self._in_thread("redeliver", delivery_id, user_id=user_id)  # type: ignore[no-any-return]
