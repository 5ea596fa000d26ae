"""How much ready work waits in the database for its user's fair share (the
``agentstate_steps_waiting_fair_share`` gauge, read at scrape time, never on a phase's
path)."""

from __future__ import annotations

from sqlalchemy import Engine

from state.workflows.fairshare import steps_waiting as _steps_waiting


def steps_waiting(engine: Engine) -> int:
    """Ready workflow steps parked in the database until their owner's running steps
    fall below AGENTSTATE_USER_STEP_CONCURRENCY (one indexed count)."""
    return _steps_waiting(engine)
