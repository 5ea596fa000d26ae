"""The agents of one deployment, and which one runs a session's turn.

A session's first message picks its agent by name (``AgentClient.send_message(...,
agent=...)``); the name is kept in the session's document under :data:`AGENT_KEY` (and in
the row's ``agent`` column, for queries) and never changes. A session of the default agent
has no such key, so a deployment with one agent reads and writes exactly what it did.

What the turn engine needs of an agent is :class:`TurnAgent`: the phase-handler agent of
``state.agent`` is one, and so is each framework adapter of ``tasks.agents`` (a LangGraph
graph, a Pydantic AI agent), which runs the framework inside the phases of the same FSM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from state.agent import PhaseContext, PhaseResult
from state.documents.codec import Document
from state.errors import AgentStateError

AGENT_KEY = "agent"  # the session document's key naming its agent (absent: the default)


class TurnAgent(Protocol):
    """An agent as the turn engine runs it: one call per work phase."""

    name: str

    def is_quick(self, phase: str) -> bool:
        """Whether ``phase`` finishes in milliseconds (see ``state.agent.quick``)."""
        ...

    def run(self, phase: str, ctx: PhaseContext) -> PhaseResult:
        """Run ``phase`` of the turn ``ctx`` describes."""
        ...


class _Missing:
    """A session's agent that this deployment no longer names: each phase fails, so its
    turn ends with an apology saying so (instead of running another agent's code)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def is_quick(self, phase: str) -> bool:
        return True

    def run(self, phase: str, ctx: PhaseContext) -> PhaseResult:
        raise AgentStateError(f"agent {self.name!r} is not configured here (AGENTSTATE_AGENTS)")


class AgentSet:
    """The default agent and the named ones; :meth:`of` picks a session's."""

    def __init__(self, default: TurnAgent, named: Mapping[str, TurnAgent] | None = None) -> None:
        self.default = default
        self.named = dict(named or {})
        # Before a phase's snapshot is read, only what holds for every agent is known: a
        # phase is taken for quick (no broker hop, a carried snapshot) only if it is quick
        # for all of them. With one agent, that is exactly that agent's answer.
        self._quick: dict[str, bool] = {}

    def of(self, doc: Document) -> TurnAgent:
        """The agent of the session whose document is ``doc``."""
        name = doc.get(AGENT_KEY)
        if name is None:
            return self.default
        found = self.named.get(str(name))
        return found if found is not None else _Missing(str(name))

    def is_quick(self, phase: str) -> bool:
        """Whether ``phase`` is quick for every agent."""
        quick = self._quick.get(phase)
        if quick is None:
            agents = [self.default, *self.named.values()]
            quick = self._quick[phase] = all(agent.is_quick(phase) for agent in agents)
        return quick
