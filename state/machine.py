"""The agent's behaviour as a finite-state machine (the seed's table, on ``transitions``).

One ``transitions.Machine`` is built per thread and shared by every AgentStateMachine:
restoring a machine at a persisted state is then an attribute assignment (about 10 us)
instead of building a Machine (about 200 us), and nothing is registered that would have
to be removed again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

from transitions import Machine, MachineError

from state.errors import InvalidTransitionError

logger = logging.getLogger(__name__)

STATES: list[str] = [
    "idle",  # waiting for the user
    "understanding",  # working out the intent
    "planning",  # deciding what to do
    "retrieving",  # fetching memory and knowledge
    "executing",  # calling tools
    "evaluating",  # judging the tool results
    "generating",  # writing the reply
    "clarifying",  # waiting for the user to clarify
    "error",
    "timeout",
]

TRANSITIONS: list[dict[str, Any]] = [
    {"trigger": "receive_input", "source": "idle", "dest": "understanding"},
    {"trigger": "intent_clear", "source": "understanding", "dest": "planning"},
    {"trigger": "need_clarification", "source": "understanding", "dest": "clarifying"},
    {"trigger": "plan_ready", "source": "planning", "dest": "retrieving"},
    {"trigger": "context_ready", "source": "retrieving", "dest": "executing"},
    {"trigger": "tools_complete", "source": "executing", "dest": "evaluating"},
    {"trigger": "retry_needed", "source": "evaluating", "dest": "executing"},
    {"trigger": "result_good", "source": "evaluating", "dest": "generating"},
    {"trigger": "response_sent", "source": "generating", "dest": "idle"},
    {"trigger": "user_responded", "source": "clarifying", "dest": "understanding"},
    {"trigger": "error_occurred", "source": "*", "dest": "error"},
    {"trigger": "timeout", "source": "*", "dest": "timeout"},
    {"trigger": "reset", "source": ["error", "timeout"], "dest": "idle"},
]

TRIGGERS: tuple[str, ...] = tuple(dict.fromkeys(t["trigger"] for t in TRANSITIONS))

# Phases in which a turn is waiting for the user rather than for a worker.
RESTING_STATES = frozenset({"idle", "clarifying"})
# Phases that run a handler; each is one Celery task by name.
WORK_PHASES: tuple[str, ...] = (
    "understanding",
    "planning",
    "retrieving",
    "executing",
    "evaluating",
    "generating",
)

_local = threading.local()


def _shared_machine() -> Machine:
    machine: Machine | None = getattr(_local, "machine", None)
    if machine is None:
        machine = Machine(
            model=None,
            states=STATES,
            transitions=TRANSITIONS,
            initial="idle",
            auto_transitions=False,
            after_state_change="_after_state_change",
        )
        _local.machine = machine
    return machine


class AgentStateMachine:
    """The agent's FSM for one session; restore it at any persisted state."""

    states: ClassVar[list[str]] = STATES
    transitions: ClassVar[list[dict[str, Any]]] = TRANSITIONS

    def __init__(self, session_id: str, initial: str = "idle") -> None:
        if initial not in STATES:
            raise InvalidTransitionError(f"unknown state {initial!r}")
        self.session_id = session_id
        self.state = initial
        self.path: list[str] = []

    def trigger(self, name: str) -> str:
        """Fire ``name``; return the new state or raise InvalidTransitionError (state kept)."""
        machine = _shared_machine()
        event = machine.events.get(name)
        if event is None:
            raise InvalidTransitionError(f"unknown trigger {name!r}")
        try:
            event.trigger(self)
        except MachineError as exc:
            raise InvalidTransitionError(
                f"trigger {name!r} is not allowed from state {self.state!r}"
            ) from exc
        return self.state

    def may_trigger(self, name: str) -> bool:
        """Whether ``name`` is allowed from the current state."""
        return destination(self.state, name) is not None

    def _after_state_change(self) -> None:
        self.path.append(self.state)
        logger.debug("[%s] entered %s", self.session_id, self.state)

    # The seed calls triggers as methods: machine.receive_input(), machine.reset(), ...
    def receive_input(self) -> str:
        return self.trigger("receive_input")

    def intent_clear(self) -> str:
        return self.trigger("intent_clear")

    def need_clarification(self) -> str:
        return self.trigger("need_clarification")

    def plan_ready(self) -> str:
        return self.trigger("plan_ready")

    def context_ready(self) -> str:
        return self.trigger("context_ready")

    def tools_complete(self) -> str:
        return self.trigger("tools_complete")

    def retry_needed(self) -> str:
        return self.trigger("retry_needed")

    def result_good(self) -> str:
        return self.trigger("result_good")

    def response_sent(self) -> str:
        return self.trigger("response_sent")

    def user_responded(self) -> str:
        return self.trigger("user_responded")

    def error_occurred(self) -> str:
        return self.trigger("error_occurred")

    def timeout(self) -> str:
        return self.trigger("timeout")

    def reset(self) -> str:
        return self.trigger("reset")


def destination(state: str, trigger: str) -> str | None:
    """Where ``trigger`` leads from ``state`` per the table, or None if not allowed."""
    for row in TRANSITIONS:
        if row["trigger"] != trigger:
            continue
        source = row["source"]
        if source in ("*", state) or (isinstance(source, list) and state in source):
            return str(row["dest"])
    return None


def mermaid_diagram() -> str:
    """The live transition table as a Mermaid state diagram."""
    lines = ["stateDiagram-v2", "    [*] --> idle"]
    for row in TRANSITIONS:
        sources = row["source"]
        if sources == "*":
            sources = [s for s in STATES if s != row["dest"]]
        elif isinstance(sources, str):
            sources = [sources]
        lines.extend(f"    {src} --> {row['dest']}: {row['trigger']}" for src in sources)
    return "\n".join(lines)
