"""The checkpoints of LangGraph graphs that run as agents (migration 0024), one LangGraph
thread per session. ``state.storage.tables`` imports this module, so both tables are in
``Base.metadata``; their ``session_id`` column makes the data lifecycle erase and prune them
with their session (``state.lifecycle.rows.keyed_by``).

Blobs are what LangGraph's own serializer writes (``type`` names its format): agentstate
reads nothing in them, and a graph's state is whatever its channels hold.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from state.storage.tables import ID, Base


class CheckpointRow(Base):
    """One checkpoint of a session's graph (written after every step of a run)."""

    __tablename__ = "lg_checkpoints"

    session_id: Mapped[str] = mapped_column(ID, primary_key=True)
    checkpoint_ns: Mapped[str] = mapped_column(String(255), primary_key=True, server_default="")
    checkpoint_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    parent_checkpoint_id: Mapped[str | None] = mapped_column(String(64))
    # The turn (its user message) whose run wrote it: a turn run again after its worker
    # died resumes its own run, and a new turn starts a new one.
    message_id: Mapped[str | None] = mapped_column(ID)
    type: Mapped[str] = mapped_column(String(32), nullable=False)
    checkpoint: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    meta: Mapped[str] = mapped_column("metadata", Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class CheckpointWriteRow(Base):
    """A pending write of a task of a step (kept so a step cut short is not run twice)."""

    __tablename__ = "lg_writes"

    session_id: Mapped[str] = mapped_column(ID, primary_key=True)
    checkpoint_ns: Mapped[str] = mapped_column(String(255), primary_key=True, server_default="")
    checkpoint_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel: Mapped[str] = mapped_column(String(255), nullable=False)
    type: Mapped[str] = mapped_column(String(32), nullable=False)
    blob: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    task_path: Mapped[str] = mapped_column(String(255), nullable=False, server_default="")
