"""Schedules and webhooks for apps and operators, mixed into ``tasks.client.AgentClient``.

Schedules (``state.schedules``) fire a message or a workflow per tick, exactly once each,
from beat; webhooks (``state.webhooks``) hear what happened, through an outbox written in
the transaction of the change. Every call that names a schedule or a hook takes
``user_id``: given, another user's reads and acts exactly as an unknown one (None, or
NotFoundError where unknown ids raise), nothing changed.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from config import Settings
from state.documents.codec import Document, require_text
from state.ids import validate_id
from state.schedules.spec import ScheduleSpec
from state.schedules.store import ScheduleStore
from state.storage.backend import Backend
from state.webhooks.deliveries import DeliveryStore
from state.webhooks.hooks import HookStore, unknown
from state.workflows.engine import WorkflowEngine
from state.workflows.served import ServedActions
from tasks.actions import known_actions


class Automation:
    """The schedules-and-webhooks part of AgentClient (see the module docstring)."""

    settings: Settings
    backend: Backend
    workflows: WorkflowEngine
    served_actions: ServedActions

    @cached_property
    def _schedules(self) -> ScheduleStore:
        return ScheduleStore(self.backend.engine, self.settings.max_schedules_per_user)

    @cached_property
    def _hooks(self) -> HookStore:
        return HookStore(self.backend.engine, self.settings.max_webhooks_per_user)

    @cached_property
    def _deliveries(self) -> DeliveryStore:
        return DeliveryStore(self.backend.engine)

    # -- schedules -------------------------------------------------------------

    def create_schedule(
        self,
        schedule_id: str,
        cron: str | None = None,
        *,
        every_seconds: float | None = None,
        user_id: str,
        session_id: str | None = None,
        text: str | None = None,
        workflow: Document | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
        overlap: str = "skip",
        payload: Document | None = None,
    ) -> Document:
        """Store a schedule of ``user_id``: exactly one of ``cron`` (five fields, in the
        IANA ``timezone``) and ``every_seconds`` (at least 1); exactly one of ``text`` (a
        message to ``session_id`` per tick) and ``workflow`` (a spec started per tick as
        ``{schedule_id}:{tick}``). ``catch_up``: ``"latest"`` (after an outage the most
        recent missed tick fires once) or ``"none"``; ``overlap``: ``"skip"`` (a tick
        whose previous run still goes is recorded skipped) or ``"enqueue"``. ``payload``
        is kept with it as is. Bad input raises a bad-input error, nothing stored; the
        same call again returns the stored schedule."""
        arguments: dict[str, Any] = {
            "cron": cron,
            "every_seconds": every_seconds,
            "user_id": user_id,
            "session_id": session_id,
            "text": text,
            "workflow": workflow,
            "timezone": timezone,
            "catch_up": catch_up,
            "overlap": overlap,
            "payload": payload,
        }
        spec = ScheduleSpec.checked(schedule_id, arguments)
        if spec.text is not None:
            require_text(spec.text, "a schedule's text", self.settings.max_message_bytes)
        if spec.workflow is not None:
            known = {*known_actions(self.settings.action_module_list), *self.served_actions.names()}
            self.workflows.validate({**spec.workflow, "workflow_id": f"{schedule_id}:x"}, known)
        return self._schedules.create(spec)

    def get_schedule(self, schedule_id: str, user_id: str | None = None) -> Document | None:
        """The schedule (with its ``next_tick``), or None."""
        _ids(schedule_id, user_id, "schedule")
        return self._schedules.get(schedule_id, user_id)

    def list_schedules(self, user_id: str | None = None) -> list[Document]:
        """Every schedule (``user_id``'s, if given), by id."""
        _ids(None, user_id, "user")
        return self._schedules.listing(user_id)

    def pause_schedule(self, schedule_id: str, user_id: str | None = None) -> Document:
        """Stop the schedule's ticks until it is resumed."""
        _ids(schedule_id, user_id, "schedule")
        return self._schedules.pause(schedule_id, user_id)

    def resume_schedule(self, schedule_id: str, user_id: str | None = None) -> Document:
        """Tick again, from the first tick after now (the paused time is not caught up)."""
        _ids(schedule_id, user_id, "schedule")
        return self._schedules.resume(schedule_id, user_id)

    def delete_schedule(self, schedule_id: str, user_id: str | None = None) -> bool:
        """Delete the schedule and its log of ticks."""
        _ids(schedule_id, user_id, "schedule")
        return self._schedules.delete(schedule_id, user_id)

    def schedule_runs(
        self, schedule_id: str, limit: int = 50, user_id: str | None = None
    ) -> list[Document]:
        """The schedule's ticks, newest first: ``{"tick", "status", "message_id" |
        "workflow_id"}`` (``status`` ``fired`` or ``skipped``; ``tick`` ISO 8601 UTC, the
        one in the workflow id)."""
        _ids(schedule_id, user_id, "schedule")
        return self._schedules.runs(schedule_id, user_id, limit)

    # -- webhooks --------------------------------------------------------------

    def add_webhook(
        self,
        url: str,
        events: list[str],
        *,
        user_id: str | None = None,
        secret: str | None = None,
        session_id: str | None = None,
    ) -> Document:
        """Register ``url`` for ``events``; returns ``{"webhook_id", "secret", ...}`` (the
        only time the secret is shown). A user's hook hears that user's events only (and
        with ``session_id``, that session's only); a hook of no user, everyone's. A URL
        that resolves to a loopback, private or link-local address is refused unless
        AGENTSTATE_WEBHOOK_ALLOW_PRIVATE."""
        return self._hooks.add(
            url,
            events,
            user_id=user_id,
            secret=secret,
            session_id=session_id,
            allow_private=self.settings.webhook_allow_private,
        )

    def list_webhooks(self, user_id: str | None = None) -> list[Document]:
        """Every hook (``user_id``'s, if given), without secrets."""
        _ids(None, user_id, "user")
        return self._hooks.listing(user_id)

    def remove_webhook(self, webhook_id: str, user_id: str | None = None) -> bool:
        """Delete the hook and its deliveries."""
        _ids(webhook_id, user_id, "webhook")
        return self._hooks.remove(webhook_id, user_id)

    def webhook_deliveries(
        self, webhook_id: str, limit: int = 50, user_id: str | None = None
    ) -> list[Document]:
        """The hook's deliveries, newest first: ``{"delivery_id", "event", "status",
        "attempts": [{"at", "status_code" | "error"}]}``; ``delivery_id`` is the
        ``webhook-id`` header of every attempt."""
        _ids(webhook_id, user_id, "webhook")
        if self._hooks.get(webhook_id, user_id) is None:
            raise unknown(webhook_id)
        return self._deliveries.listing(webhook_id, limit)

    def redeliver(self, delivery_id: str, user_id: str | None = None) -> Document:
        """Send a delivery again now (a fresh set of attempts, the same ``webhook-id``)."""
        _ids(delivery_id, user_id, "delivery")
        return self._deliveries.redeliver(delivery_id, user_id)


def _ids(object_id: str | None, user_id: str | None, kind: str) -> None:
    if object_id is not None:
        validate_id(object_id, kind)
    if user_id is not None:
        validate_id(user_id, "user")
