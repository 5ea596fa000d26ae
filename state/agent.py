"""The phase-handler protocol: how an agent plugs into the turn engine.

An agent is a module (named by ``AGENTSTATE_AGENT``) with one function per work phase:
``understanding``, ``planning``, ``retrieving``, ``executing``, ``evaluating`` and
``generating``. Each takes a :class:`PhaseContext` and returns a :class:`PhaseResult`:
what changed and the FSM trigger to fire. Handlers do not write anything themselves;
the engine commits their result together with the phase's revision bump, so a duplicate
delivery can never apply it twice. A handler decorated with :func:`quick` promises to
finish in milliseconds, which lets the ``inline`` hop policy run it without a broker hop.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, TypeVar

from state.documents.codec import Document
from state.errors import AgentStateError
from state.machine import WORK_PHASES, Phase, Trigger

# The trigger each phase fires when a handler is missing (an agent may define fewer).
DEFAULT_TRIGGERS: dict[str, str] = {
    Phase.UNDERSTANDING: Trigger.INTENT_CLEAR,
    Phase.PLANNING: Trigger.PLAN_READY,
    Phase.RETRIEVING: Trigger.CONTEXT_READY,
    Phase.EXECUTING: Trigger.TOOLS_COMPLETE,
    Phase.EVALUATING: Trigger.RESULT_GOOD,
    Phase.GENERATING: Trigger.RESPONSE_SENT,
}


@dataclass
class PhaseContext:
    """What a handler may read; reading history or user state is lazy and cheap."""

    session_id: str
    user_id: str
    phase: str
    message: str
    message_id: str
    context: Document
    tool_results: list[Any]
    pending_actions: list[Any]
    metadata: Document
    workflow: Document | None = None
    attempt: int = 1
    history_reader: Callable[[int], list[Document]] | None = None
    user_state_reader: Callable[[], Document] | None = None

    def recent_messages(self, count: int = 10) -> list[Document]:
        """The last ``count`` history items, oldest first (one indexed query)."""
        return self.history_reader(count) if self.history_reader else []

    def user_state(self) -> Document:
        """The user's persistent state (layer 3)."""
        return self.user_state_reader() if self.user_state_reader else {}


@dataclass
class PhaseResult:
    """What a handler changed, and the trigger to fire (None: wait for ``workflow``)."""

    trigger: str | None
    reply: str | None = None
    context: Document = field(default_factory=dict)
    tool_results: list[Any] | None = None
    pending_actions: list[Any] | None = None
    active_tools: list[Any] | None = None
    metadata: Document = field(default_factory=dict)
    user_state: Callable[[Document], Document] | None = None
    workflow: Document | None = None


class PhaseHandler(Protocol):
    """One phase of an agent."""

    def __call__(self, ctx: PhaseContext) -> PhaseResult: ...


H = TypeVar("H", bound=Callable[..., Any])


def quick(handler: H) -> H:
    """Declare that ``handler`` finishes in milliseconds (no I/O that may stall)."""
    handler.quick = True  # type: ignore[attr-defined]
    return handler


def is_quick(handler: Callable[..., Any] | None) -> bool:
    """Whether ``handler`` declared itself quick (a missing handler is quick)."""
    return handler is None or bool(getattr(handler, "quick", False))


class Agent:
    """The handlers of one agent, looked up by phase."""

    def __init__(self, source: ModuleType | object, name: str) -> None:
        self.name = name
        self.handlers: dict[str, PhaseHandler | None] = {
            phase: getattr(source, phase, None) for phase in WORK_PHASES
        }
        if not any(self.handlers.values()):
            raise AgentStateError(f"agent {name!r} defines none of the phases {WORK_PHASES}")

    def handler(self, phase: str) -> PhaseHandler | None:
        """The handler of ``phase`` (None: the phase just fires its default trigger)."""
        return self.handlers[phase]

    def is_quick(self, phase: str) -> bool:
        """Whether ``phase`` may run without a broker hop under the inline policy."""
        return is_quick(self.handlers[phase])

    def run(self, phase: str, ctx: PhaseContext) -> PhaseResult:
        """Call the handler of ``phase`` (or fire its default trigger)."""
        handler = self.handlers[phase]
        if handler is None:
            return PhaseResult(trigger=DEFAULT_TRIGGERS[phase])
        result = handler(ctx)
        if not isinstance(result, PhaseResult):
            raise AgentStateError(
                f"{self.name}.{phase} returned {type(result).__name__}, not PhaseResult"
            )
        return result


_agents: dict[str, Agent] = {}


def load_agent(dotted: str) -> Agent:
    """Import the agent named by a dotted path (a module, or ``module.attribute``)."""
    agent = _agents.get(dotted)
    if agent is None:
        agent = Agent(_import(dotted), dotted)
        _agents[dotted] = agent
    return agent


def _import(dotted: str) -> ModuleType | object:
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        module_name, _, attribute = dotted.rpartition(".")
        if not module_name or exc.name != dotted:
            raise AgentStateError(f"cannot import agent {dotted!r}: {exc}") from exc
        try:
            source: object = getattr(importlib.import_module(module_name), attribute)
            return source
        except (ImportError, AttributeError) as inner:
            raise AgentStateError(f"cannot import agent {dotted!r}: {inner}") from inner
