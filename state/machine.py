"""The agent's behaviour as a finite-state machine (the seed's table, on ``transitions``).

One ``transitions.Machine`` is built per thread and shared by every AgentStateMachine:
restoring a machine at a persisted state is then an attribute assignment (about 10 us)
instead of building a Machine (about 200 us), and nothing is registered that would have
to be removed again.
"""

from __future__ import annotations

import logging
import threading
from enum import StrEnum
from typing import Any, ClassVar

from transitions import Machine, MachineError

from state.errors import InvalidTransitionError

logger = logging.getLogger(__name__)


class _TransitionsAtDebug(logging.Filter):
    """``transitions`` logs each callback and state change at INFO: thousands of lines a
    minute at a worker's INFO level, drowning the task lines. They are DEBUG lines here,
    shown only when this module's logger is at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logger.isEnabledFor(logging.DEBUG)


logging.getLogger("transitions.core").addFilter(_TransitionsAtDebug())


class Phase(StrEnum):
    """The FSM's states: the seed's ten and ``awaiting_approval`` (a phase is where a
    session's turn is)."""

    IDLE = "idle"  # waiting for the user
    UNDERSTANDING = "understanding"  # working out the intent
    PLANNING = "planning"  # deciding what to do
    RETRIEVING = "retrieving"  # fetching memory and knowledge
    EXECUTING = "executing"  # calling tools
    EVALUATING = "evaluating"  # judging the tool results
    GENERATING = "generating"  # writing the reply
    CLARIFYING = "clarifying"  # waiting for the user to clarify
    ERROR = "error"
    TIMEOUT = "timeout"
    # Added to the seed's table: a person must approve what the turn wants to do next.
    AWAITING_APPROVAL = "awaiting_approval"


class Trigger(StrEnum):
    """The FSM's triggers: the seed's thirteen and the three of human approval."""

    RECEIVE_INPUT = "receive_input"
    INTENT_CLEAR = "intent_clear"
    NEED_CLARIFICATION = "need_clarification"
    PLAN_READY = "plan_ready"
    CONTEXT_READY = "context_ready"
    TOOLS_COMPLETE = "tools_complete"
    RETRY_NEEDED = "retry_needed"
    RESULT_GOOD = "result_good"
    RESPONSE_SENT = "response_sent"
    USER_RESPONDED = "user_responded"
    ERROR_OCCURRED = "error_occurred"
    TIMEOUT = "timeout"
    RESET = "reset"
    NEED_APPROVAL = "need_approval"
    APPROVED = "approved"
    REJECTED = "rejected"


# transitions gets plain strings: it treats Enum states by their member names.
STATES: list[str] = [phase.value for phase in Phase]


def _row(trigger: Trigger, source: Phase | list[Phase] | str, dest: Phase) -> dict[str, Any]:
    plain = [p.value for p in source] if isinstance(source, list) else str(source)
    return {"trigger": trigger.value, "source": plain, "dest": dest.value}


TRANSITIONS: list[dict[str, Any]] = [
    _row(Trigger.RECEIVE_INPUT, Phase.IDLE, Phase.UNDERSTANDING),
    _row(Trigger.INTENT_CLEAR, Phase.UNDERSTANDING, Phase.PLANNING),
    _row(Trigger.NEED_CLARIFICATION, Phase.UNDERSTANDING, Phase.CLARIFYING),
    _row(Trigger.PLAN_READY, Phase.PLANNING, Phase.RETRIEVING),
    _row(Trigger.CONTEXT_READY, Phase.RETRIEVING, Phase.EXECUTING),
    _row(Trigger.TOOLS_COMPLETE, Phase.EXECUTING, Phase.EVALUATING),
    _row(Trigger.RETRY_NEEDED, Phase.EVALUATING, Phase.EXECUTING),
    _row(Trigger.RESULT_GOOD, Phase.EVALUATING, Phase.GENERATING),
    _row(Trigger.RESPONSE_SENT, Phase.GENERATING, Phase.IDLE),
    _row(Trigger.USER_RESPONDED, Phase.CLARIFYING, Phase.UNDERSTANDING),
    _row(Trigger.ERROR_OCCURRED, "*", Phase.ERROR),
    _row(Trigger.TIMEOUT, "*", Phase.TIMEOUT),
    _row(Trigger.RESET, [Phase.ERROR, Phase.TIMEOUT], Phase.IDLE),
    # Human approval, added to the seed's table as data: a turn asks before it acts; an
    # approval goes on to act, a rejection straight to the reply.
    _row(Trigger.NEED_APPROVAL, [Phase.PLANNING, Phase.EXECUTING], Phase.AWAITING_APPROVAL),
    _row(Trigger.APPROVED, Phase.AWAITING_APPROVAL, Phase.EXECUTING),
    _row(Trigger.REJECTED, Phase.AWAITING_APPROVAL, Phase.GENERATING),
]

TRIGGERS: tuple[str, ...] = tuple(dict.fromkeys(t["trigger"] for t in TRANSITIONS))

# Phases in which a turn waits for the user rather than for a worker (a message starts
# or resumes a turn from here).
RESTING_PHASES = frozenset({Phase.IDLE, Phase.CLARIFYING})
# Phases in which no worker owes the session anything: resting, or a turn parked until
# a person decides an approval (new messages queue behind it).
WAITING_PHASES = RESTING_PHASES | {Phase.AWAITING_APPROVAL}
# Phases that run a handler; each is one Celery task by name.
WORK_PHASES: tuple[Phase, ...] = (
    Phase.UNDERSTANDING,
    Phase.PLANNING,
    Phase.RETRIEVING,
    Phase.EXECUTING,
    Phase.EVALUATING,
    Phase.GENERATING,
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
        self.state = str(initial)  # a plain str: transitions reads Enum states by name
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

    def need_approval(self) -> str:
        return self.trigger("need_approval")

    def approved(self) -> str:
        return self.trigger("approved")

    def rejected(self) -> str:
        return self.trigger("rejected")


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
    """The live transition table as a Mermaid state diagram.

    Measured against ``transitions``' own Mermaid support (``GraphMachine`` with
    ``graph_engine="mermaid"``): it draws the same 30 edges plus the two self-loops the
    ``*`` rows imply (error -> error, timeout -> timeout), 65 lines with styling and no
    initial marker, against 32 lines here. The same states and edges, but noisier and
    with loops no turn takes, so this short generator stays.
    """
    lines = ["stateDiagram-v2", "    [*] --> idle"]
    for row in TRANSITIONS:
        sources = row["source"]
        if sources == "*":
            sources = [s for s in STATES if s != row["dest"]]
        elif isinstance(sources, str):
            sources = [sources]
        lines.extend(f"    {src} --> {row['dest']}: {row['trigger']}" for src in sources)
    return "\n".join(lines)
