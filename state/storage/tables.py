"""The database schema (SQLAlchemy 2.0 typed models); Alembic migrations create it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    cast,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from state.documents import codec
from state.storage.generations import NewGeneration

ID = String(128)
# SQLite only auto-increments an INTEGER PRIMARY KEY.
AUTO_ID = BigInteger().with_variant(Integer(), "sqlite")


class JSONText(TypeDecorator[str]):
    """JSON stored as JSONB on Postgres and TEXT elsewhere, always read back as raw text.

    Reading raw text lets the store parse it itself, so a corrupted row is reported and
    quarantined instead of failing inside the driver.
    """

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(Text())

    def column_expression(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return cast(column, Text)

    def bind_processor(self, dialect: Dialect) -> Any:
        # JSON text goes to the driver as is; Postgres casts the literal to JSONB on write.
        return _to_json_text

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        return None


def _to_json_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return codec.dumps(value)


class Base(DeclarativeBase):
    """Declarative base of every agentstate table."""


class UserState(Base):
    """Layer 3: a user's persistent state (the seed's table; added columns have defaults)."""

    __tablename__ = "user_state"

    user_id: Mapped[str] = mapped_column(ID, primary_key=True)
    state: Mapped[str] = mapped_column(JSONText, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=text("CURRENT_TIMESTAMP")
    )
    revision: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")


class SessionRow(Base):
    """Layer 1: one session's state document (history lives in ``messages``)."""

    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(ID, primary_key=True)
    user_id: Mapped[str] = mapped_column(ID, nullable=False)  # ix_sessions_user_created
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False, default=NewGeneration())
    phase: Mapped[str] = mapped_column(String(32), nullable=False, server_default="idle")
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="active")
    revision: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    doc: Mapped[str] = mapped_column(JSONText, nullable=False)
    message_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    inbox_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # The seq of the session's last event: bumped under the row lock by every writer that
    # appends events, so a session's events are numbered 1, 2, 3... without gaps.
    event_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_task_id: Mapped[str | None] = mapped_column(String(255))
    deadline_at: Mapped[float | None] = mapped_column(Float)
    recoveries: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # The sweep's re-sends of the turn at one revision, and when it may send it again
    # (backing off: merely queued work is not multiplied; migration 0014).
    resent_revision: Mapped[int | None] = mapped_column(BigInteger)
    resends: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    resend_at: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # A fork shares its source's history: its history is the first ``prefix_count``
    # messages of ``prefix_session_id`` (read, not copied), then its own (migration 0015).
    prefix_session_id: Mapped[str | None] = mapped_column(ID)  # ix_sessions_prefix
    prefix_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # The agent a session's first message chose (AGENTSTATE_AGENTS); NULL: the default one
    # (migration 0024). Also kept in the document (``agent``), which is what workers read.
    agent: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_sessions_phase_updated", "phase", "updated_at"),
        Index("ix_sessions_prefix", "prefix_session_id"),
        # list_sessions pages newest first, optionally by user or phase.
        Index("ix_sessions_created", "created_at", "session_id"),
        Index("ix_sessions_user_created", "user_id", "created_at", "session_id"),
        Index("ix_sessions_phase_created", "phase", "created_at", "session_id"),
    )


class MessageRow(Base):
    """One history item; appended, never rewritten."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(AUTO_ID, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ID, nullable=False)
    seq: Mapped[int] = mapped_column(Integer, nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    content: Mapped[str] = mapped_column(Text, nullable=False)
    timestamp: Mapped[str] = mapped_column(String(64), nullable=False)
    meta: Mapped[str] = mapped_column("metadata", JSONText, nullable=False)

    __table_args__ = (UniqueConstraint("session_id", "seq", name="uq_messages_session_seq"),)


# (A module constant: inside InboxRow, ``text`` is the column.)
_QUEUED = text("state = 'queued'")
_UNDECIDED = text("decision IS NULL")
_RUNNING = text("status = 'running'")
_WAITING = text("waiting_since IS NOT NULL")
# Revision checkpoints retention has not yet made a floor (nothing of the session below
# them is left): only these can be due (``state.events.retention``, migration 0023).
UNFLOORED = text("doc IS NOT NULL AND is_floor = false")
# Ready steps that owe a worker something: not waiting for an approval, not parked for
# their owner's fair share (the recovery sweep's look for lost ones, migration 0023).
UNATTENDED = text(
    "status IN ('pending', 'retrying') AND waiting_since IS NULL "
    "AND (approval IS NULL OR approval <> 'pending')"
)


class InboxRow(Base):
    """A user message accepted for a session, waiting for (or given) its turn."""

    __tablename__ = "inbox"

    message_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(ID, nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False, server_default="queued")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # The caller's key for this message: the database refuses a second one per session.
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    # The session's user (migration 0021): AGENTSTATE_MAX_QUEUED_MESSAGES_PER_USER counts
    # a user's waiting messages through ix_inbox_user_queued, not through their sessions.
    user_id: Mapped[str | None] = mapped_column(ID)

    __table_args__ = (
        UniqueConstraint("session_id", "seq", name="uq_inbox_session_seq"),
        Index("uq_inbox_session_key", "session_id", "idempotency_key", unique=True),
        # A session's queued messages, in order: what a turn reads next (only queued rows,
        # so the read does not grow with the session's answered ones).
        Index(
            "ix_inbox_session_queued",
            "session_id",
            "seq",
            postgresql_where=_QUEUED,
            sqlite_where=_QUEUED,
        ),
        Index("ix_inbox_user_queued", "user_id", postgresql_where=_QUEUED, sqlite_where=_QUEUED),
    )


class WorkflowRow(Base):
    """Layer 2: one workflow and its running totals."""

    __tablename__ = "workflows"

    workflow_id: Mapped[str] = mapped_column(ID, primary_key=True)
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False, default=NewGeneration())
    session_id: Mapped[str | None] = mapped_column(ID)  # ix_workflows_session_created
    # The owner: the session's user, or the user who started a workflow of no session
    # (None: started by trusted code without a user; only unscoped callers reach it).
    user_id: Mapped[str | None] = mapped_column(ID)  # ix_workflows_user_created
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="running")
    context: Mapped[str] = mapped_column(JSONText, nullable=False)
    total_steps: Mapped[int] = mapped_column(Integer, nullable=False)
    remaining_steps: Mapped[int] = mapped_column(Integer, nullable=False)
    failed_steps: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    resume_revision: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The fingerprint of the spec it was started from: a repeated start with the same
    # workflow_id is the same request only if the spec is the same.
    spec_hash: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        # list_workflows pages newest first, optionally by session or status; the
        # session's and the status's indexes serve lookups by either alone too.
        Index("ix_workflows_created", "created_at", "workflow_id"),
        Index("ix_workflows_session_created", "session_id", "created_at", "workflow_id"),
        Index("ix_workflows_user_created", "user_id", "created_at", "workflow_id"),
        Index("ix_workflows_status_created", "status", "created_at", "workflow_id"),
        # Retention's scan for workflows finished long ago (migration 0015).
        Index("ix_workflows_finished", "finished_at"),
    )


class StepRow(Base):
    """One workflow step; ``remaining_deps`` counts its unfinished dependencies."""

    __tablename__ = "workflow_steps"

    workflow_id: Mapped[str] = mapped_column(ID, primary_key=True)
    step_id: Mapped[str] = mapped_column(ID, primary_key=True)
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False)  # its workflow's
    step_name: Mapped[str] = mapped_column(String(255), nullable=False)
    action: Mapped[str] = mapped_column(String(128), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    inputs: Mapped[str] = mapped_column(JSONText, nullable=False)
    outputs: Mapped[str] = mapped_column(JSONText, nullable=False)
    dependencies: Mapped[str] = mapped_column(JSONText, nullable=False)
    dependents: Mapped[str] = mapped_column(JSONText, nullable=False)
    remaining_deps: Mapped[int] = mapped_column(Integer, nullable=False)
    retry_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # A run longer than timeout_s is a failed attempt; deadline_at is the current run's.
    timeout_s: Mapped[float | None] = mapped_column(Float)
    deadline_at: Mapped[float | None] = mapped_column(Float)
    # A durable timer: runnable not before ready_at (= when it became ready + not_before_s).
    not_before_s: Mapped[float | None] = mapped_column(Float)
    ready_at: Mapped[float | None] = mapped_column(Float)
    # Human approval: NULL (none needed), "pending" (waits for a decision), "approved".
    approval: Mapped[str | None] = mapped_column(String(16))
    max_retries: Mapped[int] = mapped_column(Integer, nullable=False)
    revision: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    recoveries: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # Fair share (migration 0014): the workflow's owner ("" for none), and since when a
    # ready step waits for one of its owner's AGENTSTATE_USER_STEP_CONCURRENCY slots.
    owner: Mapped[str] = mapped_column(ID, nullable=False, server_default="")
    waiting_since: Mapped[float | None] = mapped_column(Float)
    # A quick root held back at its workflow's start (beyond its owner's window): each
    # finished step of the owner hands one over.
    held: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    # The sweep's re-sends at one revision, and when it may send again (as for sessions).
    resent_revision: Mapped[int | None] = mapped_column(BigInteger)
    resends: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    resend_at: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[float | None] = mapped_column(Float)
    last_task_id: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (
        Index("ix_steps_status_updated", "status", "updated_at"),
        # An owner's running steps (counted by a claim) and waiting ones (oldest first).
        Index(
            "ix_steps_owner_running",
            "owner",
            postgresql_where=_RUNNING,
            sqlite_where=_RUNNING,
        ),
        Index(
            "ix_steps_owner_waiting",
            "owner",
            "waiting_since",
            postgresql_where=_WAITING,
            sqlite_where=_WAITING,
        ),
        # Leading with status as ix_steps_status_updated does: for each status the sweep
        # asks about it is the same range, of fewer rows, so the planner prefers it.
        Index(
            "ix_steps_unattended",
            "status",
            "updated_at",
            postgresql_where=UNATTENDED,
            sqlite_where=UNATTENDED,
        ),
        # Room for a dependent's countdown to be a HOT update (migration 0008).
        {"postgresql_with": {"fillfactor": 80}},
    )


class QuarantineRow(Base):
    """A stored document that could not be read, kept verbatim for an operator."""

    __tablename__ = "quarantine"

    id: Mapped[int] = mapped_column(AUTO_ID, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    key: Mapped[str] = mapped_column(String(256), nullable=False)
    payload: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class ActionRow(Base):
    """A workflow action a worker serves (published at worker start; the last one wins)."""

    __tablename__ = "actions"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    module: Mapped[str] = mapped_column(String(255), nullable=False)
    worker: Mapped[str] = mapped_column(String(255), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class EventRow(Base):
    """One event of a session's log, appended in the transaction of the change it tells."""

    __tablename__ = "events"

    session_id: Mapped[str] = mapped_column(ID, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(String(64), nullable=False)
    revision: Mapped[int] = mapped_column(BigInteger, nullable=False)
    phase: Mapped[str] = mapped_column(String(32), nullable=False)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    data: Mapped[str] = mapped_column(JSONText, nullable=False)

    # Retention prunes by age.
    __table_args__ = (Index("ix_events_at", "at"),)


class RevisionRow(Base):
    """One committed revision of a session, kept compactly: the document's changes since
    the revision before (``patch``), or the whole document (``doc``) every few revisions."""

    __tablename__ = "revisions"

    session_id: Mapped[str] = mapped_column(ID, primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    phase: Mapped[str] = mapped_column(String(32), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    trigger: Mapped[str | None] = mapped_column(String(255))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # The history at this revision is the messages with seq < message_count.
    message_count: Mapped[int] = mapped_column(Integer, nullable=False)
    # The seq of the last event this revision's commit appended.
    event_seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    doc: Mapped[str | None] = mapped_column(JSONText)
    # JSON text: nothing queries into it, and text is about half the size of JSONB here.
    patch: Mapped[str | None] = mapped_column(Text)
    # Retention deleted every record of the session below this checkpoint (migration 0023).
    is_floor: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())

    __table_args__ = (
        Index("ix_revisions_at", "at"),
        # The checkpoints retention may still have to prune below, oldest first.
        Index("ix_revisions_unfloored", "at", postgresql_where=UNFLOORED, sqlite_where=UNFLOORED),
    )


class ApprovalRow(Base):
    """A request for a person's decision: a turn's (``session_id``) or a workflow step's
    (``workflow_id``, ``step_id``). ``decision`` is set once, by a guarded update."""

    __tablename__ = "approvals"

    approval_id: Mapped[str] = mapped_column(ID, primary_key=True)
    session_id: Mapped[str | None] = mapped_column(ID)
    user_id: Mapped[str | None] = mapped_column(ID)
    workflow_id: Mapped[str | None] = mapped_column(ID)
    step_id: Mapped[str | None] = mapped_column(ID)
    action: Mapped[str] = mapped_column(String(128), nullable=False)
    args: Mapped[str] = mapped_column(JSONText, nullable=False)
    requested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    decision: Mapped[str | None] = mapped_column(String(16))
    decided_by: Mapped[str | None] = mapped_column(String(128))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    note: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        # Listing newest first (by user), and beat's scan for expired requests.
        Index("ix_approvals_requested", "requested_at", "approval_id"),
        Index("ix_approvals_user_requested", "user_id", "requested_at", "approval_id"),
        Index("ix_approvals_decision_expires", "decision", "expires_at"),
        Index("ix_approvals_workflow_step", "workflow_id", "step_id"),
        Index("ix_approvals_session", "session_id"),
        Index("ix_approvals_decided", "decided_at"),
        # A user's undecided requests, counted against AGENTSTATE_MAX_PENDING_APPROVALS.
        Index(
            "ix_approvals_user_pending",
            "user_id",
            "expires_at",
            postgresql_where=_UNDECIDED,
            sqlite_where=_UNDECIDED,
        ),
    )


user_state: Table = Base.metadata.tables["user_state"]
sessions: Table = Base.metadata.tables["sessions"]
messages: Table = Base.metadata.tables["messages"]
inbox: Table = Base.metadata.tables["inbox"]
workflows: Table = Base.metadata.tables["workflows"]
steps: Table = Base.metadata.tables["workflow_steps"]
quarantine: Table = Base.metadata.tables["quarantine"]
actions: Table = Base.metadata.tables["actions"]
events: Table = Base.metadata.tables["events"]
revisions: Table = Base.metadata.tables["revisions"]
approvals: Table = Base.metadata.tables["approvals"]

# Schedules and webhooks live in a module of their own; importing it registers its tables
# in Base.metadata, so every table is known wherever this module is.
import state.storage.tables_agent_steps  # noqa: E402
import state.storage.tables_automation  # noqa: E402
import state.storage.tables_checkpoints  # noqa: E402,F401
