"""The recorded steps of framework agents' runs (migration 0026): each model request and
each tool call of a Pydantic AI run (``tasks.integrations.pydantic_ai``), its result stored
before the next step begins, so a turn whose worker died resumes without doing a finished
step again. ``state.storage.tables`` imports this module; the ``session_id`` column makes
the data lifecycle erase and prune the rows with their session.

A row is one step of one run of one turn: ``message_id`` names the turn (its user
message), ``run`` the run (0, then one more after each person's decision), ``name`` the
step (the framework's name for the operation) and ``n`` its occurrence in the run. Names
starting with ``~`` are the turn's own notes (how a run ended waiting for people, the
decisions). ``payload`` is JSON, as the framework's own codec wrote it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from state.storage.tables import ID, Base


class AgentStepRow(Base):
    """One recorded step (or a run's ending, or a decision) of a framework agent's turn."""

    __tablename__ = "agent_steps"

    session_id: Mapped[str] = mapped_column(ID, primary_key=True)
    message_id: Mapped[str] = mapped_column(ID, primary_key=True)
    run: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)
    payload: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
