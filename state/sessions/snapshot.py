"""The values a session store reads and writes: a snapshot, a change, an inbox item."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection

from state.documents import codec
from state.documents.codec import Document

TransactionOp = Callable[[Connection], None]


class InboxState(StrEnum):
    """Where a user message is: waiting for its turn, in its turn, answered, or removed
    with its turn by a later message's ``multitask_strategy="rollback"``."""

    QUEUED = "queued"
    STARTED = "started"
    ANSWERED = "answered"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class Snapshot:
    """A session row as read at one ``revision`` (the row fence)."""

    session_id: str
    user_id: str
    phase: str
    status: str
    revision: int
    doc: Document
    message_count: int
    last_task_id: str | None = None
    deadline_at: float | None = None
    stored: bool = True  # False: not in the database yet (its first commit inserts it)
    # Recoveries of this revision so far (read from the database; a cached copy says 0).
    recoveries: int = 0
    # True: taken from a task message (untrusted), so its commit also requires the row to
    # hold exactly this snapshot (see ``SessionStore.verifies_carried``).
    carried: bool = False

    def to_cache(self) -> Document:
        """The cache payload (everything but the revision, which the entry carries)."""
        return {
            "user_id": self.user_id,
            "phase": self.phase,
            "status": self.status,
            "doc": self.doc,
            "message_count": self.message_count,
            "last_task_id": self.last_task_id,
            "deadline_at": self.deadline_at,
        }

    @classmethod
    def from_cache(cls, session_id: str, revision: int, payload: Document) -> Snapshot:
        """Rebuild from a cache payload (KeyError/TypeError if it is not one)."""
        return cls(
            session_id=session_id,
            user_id=str(payload["user_id"]),
            phase=str(payload["phase"]),
            status=str(payload["status"]),
            revision=revision,
            doc=dict(payload["doc"]),
            message_count=int(payload["message_count"]),
            last_task_id=payload.get("last_task_id"),
            deadline_at=payload.get("deadline_at"),
        )


# The most JSON characters a phase message carries as its snapshot; a bigger snapshot
# is not carried (its phase reads the cache), and a message carrying more is refused.
CARRY_MAX_CHARS = 32 * 1024


def carried_object(raw: str) -> Document | None:
    """The JSON object a task message carries (a snapshot, a step), or None if ``raw`` is
    over the limit, not JSON or not an object; its fields are the caller's to check."""
    if len(raw) > CARRY_MAX_CHARS:
        return None
    try:
        payload = codec.loads(raw)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def carried_snapshot(session_id: str, revision: int, raw: str) -> Snapshot | None:
    """The snapshot a phase message carries (``Snapshot.to_cache`` as JSON), or None if
    it is not one. Every field is type-checked: the message is untrusted, and its commit
    only lands if the stored row matches it."""
    payload = carried_object(raw)
    if payload is None or not _carried_fields_fit(payload) or not _as_written(raw, payload):
        return None
    return Snapshot(
        session_id=session_id,
        user_id=payload["user_id"],
        phase=payload["phase"],
        status=payload["status"],
        revision=revision,
        doc=payload["doc"],
        message_count=payload["message_count"],
        last_task_id=payload.get("last_task_id"),
        deadline_at=payload.get("deadline_at"),
        carried=True,
    )


def _as_written(raw: str, payload: Document) -> bool:
    """Whether ``raw`` is exactly what a writer sends (``codec.dumps``). The commit binds
    the snapshot to the row as jsonb, which reads ``1e2`` as ``100`` and ``-0.0`` as
    ``0.0``; the handler would get a float, or a negative zero, where the row holds
    something else. (Key order is no part of a document: a read from the row has
    jsonb's, a snapshot its writer's.)"""
    return "-0.0" not in raw and codec.dumps(payload) == raw


def _carried_fields_fit(payload: Document) -> bool:
    count, deadline = payload.get("message_count"), payload.get("deadline_at")
    return (
        all(isinstance(payload.get(name), str) for name in ("user_id", "phase", "status"))
        and isinstance(payload.get("doc"), dict)
        and isinstance(count, int)
        and not isinstance(count, bool)
        and 0 <= count < 2**31
        and isinstance(payload.get("last_task_id"), str | None)
        and (deadline is None or isinstance(deadline, float | int))
        and not isinstance(deadline, bool)
    )


@dataclass(frozen=True)
class NewEvent:
    """An event a commit appends to the session's log (the store numbers it)."""

    kind: str
    data: Document = field(default_factory=dict)


@dataclass
class SessionChange:
    """Everything one guarded commit writes, in one transaction.

    ``events`` are appended to the session's log with it (the store adds the closing
    ``phase_committed``); ``trigger`` names what made the revision (recorded with it);
    ``prepare`` runs in the transaction before the session row is locked, to take other
    rows' locks in the order their own writers take them (workflow, then session).
    """

    phase: str
    status: str
    doc: Document
    new_messages: list[Document] = field(default_factory=list)
    task_id: str | None = None
    deadline_at: float | None = None
    inbox_state: dict[str, InboxState] = field(default_factory=dict)
    ops: list[TransactionOp] = field(default_factory=list)
    check_inbox: bool = False
    events: list[NewEvent] = field(default_factory=list)
    trigger: str | None = None
    prepare: list[TransactionOp] = field(default_factory=list)


@dataclass(frozen=True)
class Staged:
    """A phase's commit held back to travel with a later one (``SessionStore.stage``):
    the snapshot it starts from and the one it leads to, and the backend's statement and
    parameters for it."""

    base: Snapshot
    snapshot: Snapshot
    statement: Any
    params: dict[str, Any]


@dataclass(frozen=True)
class CommitResult:
    """The snapshot after a commit, and whether messages are waiting in the inbox."""

    snapshot: Snapshot
    queued: bool


@dataclass(frozen=True)
class InboxItem:
    """A user message accepted for a session."""

    message_id: str
    session_id: str
    seq: int
    text: str
    state: InboxState
    created_at: datetime
    # Whether the session was resting, with no earlier message waiting, when the message
    # arrived (``state.sessions.inbox.owes_kick``). A message that arrives mid-turn needs
    # no kick: the commit that ends the turn locks the same row after this one committed,
    # so its check of the inbox is certain to see the message. One behind a waiting
    # message needs none either: the turn that message's kick starts goes on to it.
    needs_kick: bool = True
    session_revision: int | None = None  # the session's revision when the message arrived
