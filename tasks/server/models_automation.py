"""The bodies of ``/v1/schedules`` and ``/v1/webhooks`` (part of the OpenAPI document, as
``tasks.server.models``: strict requests, responses that may grow fields)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tasks.server.models import ID_PATTERN, MAX_TEXT_CHARS


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Document(BaseModel):
    model_config = ConfigDict(extra="allow")


class ScheduleIn(_Request):
    """A schedule: exactly one of ``cron`` (five fields, in ``timezone``) and
    ``every_seconds``; exactly one of ``text`` (a message to ``session_id``) and
    ``workflow`` (a spec started per tick as ``{schedule_id}:{tick}``). Without
    ``schedule_id`` the server mints one. With a user's key, ``user_id`` is that user."""

    schedule_id: str | None = Field(None, pattern=ID_PATTERN, examples=["nightly-digest"])
    cron: str | None = Field(None, max_length=255, examples=["0 9 * * 1-5"])
    every_seconds: float | None = Field(None, ge=1, strict=False)
    user_id: str | None = Field(None, pattern=ID_PATTERN, examples=["alice"])
    session_id: str | None = Field(None, pattern=ID_PATTERN)
    text: str | None = Field(None, max_length=MAX_TEXT_CHARS, examples=["what is on today?"])
    workflow: dict[str, Any] | None = None
    timezone: str = Field("UTC", max_length=64, examples=["Europe/Paris"])
    catch_up: str = Field("latest", pattern="^(latest|none)$")
    overlap: str = Field("skip", pattern="^(skip|enqueue)$")
    payload: dict[str, Any] | None = None


class ScheduleOut(_Document):
    """A schedule and its next tick (ISO 8601 UTC; None while paused)."""

    schedule_id: str
    user_id: str
    cron: str | None = None
    every_seconds: float | None = None
    timezone: str
    session_id: str | None = None
    text: str | None = None
    workflow: dict[str, Any] | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    catch_up: str
    overlap: str
    paused: bool
    next_tick: str | None = None
    last_tick: str | None = None


class ScheduleRunOut(_Document):
    """One tick: ``fired`` (its message or workflow) or ``skipped`` (with the reason)."""

    tick: str
    status: str
    message_id: str | None = None
    workflow_id: str | None = None
    reason: str | None = None


class WebhookIn(_Request):
    """A URL to tell about ``events``. With a user's key the hook is that user's (their
    events only); an operator's hook with no ``user_id`` hears everyone's."""

    url: str = Field(min_length=1, max_length=2048, examples=["https://example.com/hooks"])
    events: list[str] = Field(min_length=1, max_length=16, examples=[["turn.completed"]])
    user_id: str | None = Field(None, pattern=ID_PATTERN)
    session_id: str | None = Field(None, pattern=ID_PATTERN)
    secret: str | None = Field(None, max_length=128)


class WebhookOut(_Document):
    """A registered hook (its secret only in the answer that created it)."""

    webhook_id: str
    url: str
    events: list[str]
    user_id: str | None = None
    session_id: str | None = None
    enabled: bool
    secret: str | None = None


class AttemptOut(_Document):
    """One attempt: when, and the receiver's status code or the error."""

    at: str
    status_code: int | None = None
    error: str | None = None


class DeliveryOut(_Document):
    """One event for one hook; ``delivery_id`` is its ``webhook-id`` header."""

    delivery_id: str
    event: str
    status: str
    attempts: list[AttemptOut] = Field(default_factory=list)
