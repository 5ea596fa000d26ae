"""The DBOS baseline: a durable workflow of six steps per turn.

DBOS checkpoints each step's output in its Postgres system database before the next step
runs (and the workflow's status when it starts and ends), so a turn is six durable steps,
like agentstate's six phases. Each process launches DBOS (its own executor id) and runs
its share of the turns in-process; ``bench.warm`` times them after launch and a warm-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dbos import DBOS

from bench.warm import one_at_a_time

SETUP_LOCK = 7_401_002  # an advisory lock key of our own
PHASES = ("understanding", "planning", "retrieving", "executing", "evaluating", "generating")


@DBOS.step()
def phase_step(phase: str, state: dict[str, Any]) -> dict[str, Any]:
    """One phase: what the LangGraph nodes do (a note in the context, then a reply)."""
    if phase == "generating":
        return {**state, "phase": phase, "reply": f"You said {state['message']}"}
    return {**state, "phase": phase, "context": {**state.get("context", {}), phase: True}}


@DBOS.workflow()
def turn(session_id: str, text: str) -> str:
    """One turn: six steps, each checkpointed."""
    state: dict[str, Any] = {"session_id": session_id, "message": text}
    for phase in PHASES:
        state = phase_step(phase, state)
    return str(state["reply"])


def launch(url: str, executor: str) -> None:
    """Configure and launch DBOS on the system database at ``url`` (one process at a time:
    the first creates DBOS's tables)."""
    DBOS(
        config={
            "name": "agentstate-bench",
            "system_database_url": url,
            "executor_id": executor,
            "application_version": "bench",
            "log_level": "WARNING",
        }
    )
    with one_at_a_time(url, SETUP_LOCK):
        DBOS.launch()


def prepare(
    url: str, prefix: str, sessions: int, turns: int
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Launch DBOS and run one warm-up turn; return the timed run."""
    launch(url, prefix)
    turn(f"{prefix}-warm", "hello")

    def run() -> None:
        for k in range(turns):
            for i in range(sessions):
                turn(f"{prefix}-{i}", f"hello number {k}")

    return run, DBOS.destroy
