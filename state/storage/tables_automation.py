"""The tables of work that starts itself and news that leaves: schedules and their runs,
webhooks and their outbox of deliveries (migration 0020). ``state.storage.tables`` imports
this module, so every table is in ``Base.metadata``.

Column names matter for the data lifecycle (``state.lifecycle.rows.keyed_by``): a table with
``user_id`` is erased with its user, one with ``session_id`` with its session. A schedule
names the session it writes to as ``target_session_id`` and a run the workflow it started as
``run_workflow_id``, so that pruning a session or a workflow leaves the user's schedules and
their log alone; a webhook limited to one session is deleted with it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, Float, Index, Integer, String, Text, false, text, true
from sqlalchemy.orm import Mapped, mapped_column

from state.storage.tables import ID, Base, JSONText

_ACTIVE = text("paused = false")
_PENDING = text("status = 'pending'")


class ScheduleRow(Base):
    """A cron expression or an interval, and what each tick does (a message or a workflow)."""

    __tablename__ = "schedules"

    schedule_id: Mapped[str] = mapped_column(ID, primary_key=True)
    user_id: Mapped[str] = mapped_column(ID, nullable=False)
    cron: Mapped[str | None] = mapped_column(String(255))
    every_seconds: Mapped[float | None] = mapped_column(Float)
    timezone: Mapped[str] = mapped_column(String(64), nullable=False)
    target_session_id: Mapped[str | None] = mapped_column(ID)
    text: Mapped[str | None] = mapped_column(Text)
    workflow: Mapped[str | None] = mapped_column(JSONText)
    # Whatever the creator wants carried along (a LangGraph cron's assistant and input).
    payload: Mapped[str] = mapped_column(JSONText, nullable=False)
    catch_up: Mapped[str] = mapped_column(String(16), nullable=False)
    overlap: Mapped[str] = mapped_column(String(16), nullable=False)
    paused: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    # The next tick to fire (UTC); beat fires rows whose next_tick has come.
    next_tick: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    last_tick: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (
        Index("ix_schedules_user", "user_id", "schedule_id"),
        # Beat's look for due ticks reads only the schedules that run.
        Index("ix_schedules_due", "next_tick", postgresql_where=_ACTIVE, sqlite_where=_ACTIVE),
    )


class ScheduleRunRow(Base):
    """One tick of a schedule: the guarded row that makes it fire once (its key)."""

    __tablename__ = "schedule_runs"

    schedule_id: Mapped[str] = mapped_column(ID, primary_key=True)
    tick: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(ID, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    message_id: Mapped[str | None] = mapped_column(String(64))
    run_workflow_id: Mapped[str | None] = mapped_column(ID)
    # Why a tick was skipped: the run before still going, or the target refusing it.
    reason: Mapped[str | None] = mapped_column(Text)
    fired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (Index("ix_schedule_runs_fired", "fired_at"),)


class WebhookRow(Base):
    """A URL that hears some events: a user's (their events only) or an operator's (all)."""

    __tablename__ = "webhooks"

    webhook_id: Mapped[str] = mapped_column(ID, primary_key=True)
    user_id: Mapped[str | None] = mapped_column(ID)
    # Only this session's events (an A2A push notification config), if set.
    session_id: Mapped[str | None] = mapped_column(ID)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    secret: Mapped[str] = mapped_column(String(128), nullable=False)
    events: Mapped[str] = mapped_column(JSONText, nullable=False)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=true())
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # An A2A push notification config (migration 0028): the task it hears (the turn's
    # message id; the outbox triggers give it that task's events only), the config's id,
    # and what it asks to be sent back (``X-A2A-Notification-Token``, ``Authorization``).
    a2a_task: Mapped[str | None] = mapped_column(String(64))
    a2a_config: Mapped[str | None] = mapped_column(ID)
    a2a_token: Mapped[str | None] = mapped_column(Text)
    a2a_auth: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_webhooks_user", "user_id", "created_at"),
        Index("uq_webhooks_a2a", "a2a_task", "a2a_config", unique=True),
    )


class DeliveryRow(Base):
    """One event for one hook: written in the transaction of the change that caused it (the
    outbox), sent by workers until it is delivered or given up. Its id is the
    ``webhook-id`` header of every attempt."""

    __tablename__ = "webhook_deliveries"

    delivery_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(ID, nullable=False)
    # The user the event is about (erased with them), None for an ownerless workflow's.
    user_id: Mapped[str | None] = mapped_column(ID)
    event: Mapped[str] = mapped_column(String(64), nullable=False)
    # The body, fixed when the event happened: every attempt sends the same bytes.
    payload: Mapped[str] = mapped_column(JSONText, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="pending")
    # Attempts since the delivery was written (or redelivered), against the maximum.
    tries: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # When it is due (epoch seconds); while a worker has it, when its claim runs out.
    next_at: Mapped[float] = mapped_column(Float, nullable=False)
    claim: Mapped[str | None] = mapped_column(String(64))
    # [{"at", "status_code" | "error"}], every attempt, oldest first.
    attempts: Mapped[str] = mapped_column(JSONText, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (
        Index("ix_deliveries_hook_created", "webhook_id", "created_at"),
        Index("ix_deliveries_due", "next_at", postgresql_where=_PENDING, sqlite_where=_PENDING),
        Index("ix_deliveries_created", "created_at"),
    )


schedules = Base.metadata.tables["schedules"]
schedule_runs = Base.metadata.tables["schedule_runs"]
webhooks = Base.metadata.tables["webhooks"]
deliveries = Base.metadata.tables["webhook_deliveries"]
