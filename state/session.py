"""Layer 1, session state: one user's conversation with an agent."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from state.clock import utcnow
from state.errors import CorruptStateError

ROLES = ("user", "assistant", "system", "tool")


class SessionStatus(StrEnum):
    """Where a session is in its life (the FSM phase says where a turn is)."""

    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"


def make_message(
    role: str, content: str, metadata: dict[str, Any] | None = None, timestamp: str | None = None
) -> dict[str, Any]:
    """A history item in the current (v3) shape."""
    return {
        "role": role,
        "content": content,
        "timestamp": timestamp or utcnow().isoformat(),
        "metadata": dict(metadata or {}),
    }


@dataclass
class SessionState:
    """The full lifecycle of one interaction (the seed's fields, plus phase and tool results)."""

    session_id: str
    user_id: str
    status: SessionStatus
    created_at: datetime
    updated_at: datetime
    message_history: list[dict[str, Any]] = field(default_factory=list)
    active_tools: list[Any] = field(default_factory=list)
    pending_actions: list[Any] = field(default_factory=list)
    context_window: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    tool_results: list[Any] = field(default_factory=list)
    phase: str = "idle"

    @classmethod
    def new(cls, session_id: str, user_id: str) -> SessionState:
        """A fresh, active, idle session."""
        now = utcnow()
        return cls(session_id, user_id, SessionStatus.ACTIVE, now, now)

    def add_message(
        self, role: str, content: str, metadata: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Append a message to the history and return it."""
        message = make_message(role, content, metadata)
        self.message_history.append(message)
        self.updated_at = utcnow()
        return message

    def is_expired(self, ttl_seconds: float = 3600) -> bool:
        """True when nothing happened for longer than ``ttl_seconds``."""
        now = datetime.now(self.updated_at.tzinfo) if self.updated_at.tzinfo else datetime.now()
        return (now - self.updated_at).total_seconds() > ttl_seconds

    def to_document(self) -> dict[str, Any]:
        """The JSON-ready document (``_version`` is stamped by the store)."""
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "status": self.status.value,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "message_history": list(self.message_history),
            "active_tools": list(self.active_tools),
            "pending_actions": list(self.pending_actions),
            "context_window": dict(self.context_window),
            "metadata": dict(self.metadata),
            "tool_results": list(self.tool_results),
            "phase": self.phase,
        }

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> SessionState:
        """Rebuild from a (migrated) document; a wrong shape raises CorruptStateError."""
        try:
            return cls(
                session_id=str(doc["session_id"]),
                user_id=str(doc.get("user_id", "")),
                status=SessionStatus(doc.get("status", "active")),
                created_at=_parse_time(doc.get("created_at")),
                updated_at=_parse_time(doc.get("updated_at")),
                message_history=_typed(doc, "message_history", list),
                active_tools=_typed(doc, "active_tools", list),
                pending_actions=_typed(doc, "pending_actions", list),
                context_window=_typed(doc, "context_window", dict),
                metadata=_typed(doc, "metadata", dict),
                tool_results=_typed(doc, "tool_results", list),
                phase=str(doc.get("phase", "idle")),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptStateError(f"session document is malformed: {exc}") from exc


def _typed(doc: dict[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(f"{key} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _parse_time(value: object) -> datetime:
    if value is None:
        return utcnow()
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise TypeError(f"timestamp must be a string, got {type(value).__name__}")
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
