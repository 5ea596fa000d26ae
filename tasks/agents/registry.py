"""The agent registry: each configured agent's name, kind and runnable form.

AGENTSTATE_AGENT is the default agent (named ``default``); AGENTSTATE_AGENTS adds named
ones (``name=dotted.path[:attribute]``, parsed by ``config.agents``). The kind of each is
found from the object itself, by duck typing and by the module its class comes from, so no
framework is imported unless an agent of its kind is configured:

- ``phases``: a module or object with phase handlers (``understanding`` ... ``generating``);
- ``langgraph``: a compiled LangGraph graph (``tasks.integrations.langgraph``);
- ``pydantic-ai``: a Pydantic AI ``Agent`` (``tasks.integrations.pydantic_ai``).

Extension point, for a framework kind: an entry of :data:`FRAMEWORKS` (a
:class:`FrameworkKind`: its name, the module prefixes of the objects it takes, and the
integration module), whose module defines ``make_adapter(obj, name, settings) ->
FrameworkAdapter``. The adapter's ``run_turn`` runs one turn (or the rest of one, after a
person's decision) and returns a :class:`TurnOutcome`; ``tasks.agents.framework`` runs it
inside the turn's ``executing`` phase, so the turn walks the FSM, is locked, cancellable,
double-texted, streamed, recovered and erased as every other turn is.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from config import Settings
from config.agents import DEFAULT_AGENT, FILE_TARGET
from state.agent import Agent, PhaseContext, load_agent
from state.agent import _import as import_dotted
from state.agent_set import AgentSet, TurnAgent
from state.documents.codec import Document
from state.errors import AgentStateError, BadInputError

PHASES = "phases"


@dataclass
class FrameworkTurn:
    """One run of a framework agent, as its adapter sees it.

    Attributes:
        ctx: the phase's context: ``session_id``, ``user_id``, ``message`` and
            ``message_id`` (the user message the turn answers), ``stream(text)`` for the
            answer's chunks, ``emit``, ``recent_messages``, ``user_state``.
        decision: None for a run that starts (or, its worker lost, resumes) the turn;
            after a person decided the approval the run asked for, the decision:
            ``{approval_id, action, args, approved, by, note}``: resume with it.
    """

    ctx: PhaseContext
    decision: Document | None = None


@dataclass
class TurnOutcome:
    """How a run ended: with the turn's ``reply``, or waiting for a person's decision on
    ``approval`` (``{"action": str, "args": dict, "ttl_s"?: float}``)."""

    reply: str | None = None
    approval: Document | None = None


class FrameworkAdapter(Protocol):
    """A framework's agent as agentstate runs it (what ``make_adapter`` returns)."""

    def run_turn(self, turn: FrameworkTurn) -> TurnOutcome:
        """Run the turn (its worker may have died before: resume from what was saved)."""
        ...


@dataclass(frozen=True)
class FrameworkKind:
    """A kind of agent that a framework provides.

    Attributes:
        name: the kind (``langgraph``), as ``list_agents`` reports it.
        prefixes: the module prefixes of the classes of the objects it takes.
        module: the integration module, which defines ``make_adapter``.
        looks_like: a further test of the object (duck typing), after the prefix matched.
    """

    name: str
    prefixes: tuple[str, ...]
    module: str
    looks_like: Callable[[object], bool] = field(default=lambda obj: True)


FRAMEWORKS: list[FrameworkKind] = [
    FrameworkKind(
        "langgraph",
        ("langgraph.",),
        "tasks.integrations.langgraph",
        lambda obj: callable(getattr(obj, "stream", None)) and hasattr(obj, "get_state"),
    ),
    FrameworkKind(
        "pydantic-ai",
        ("pydantic_ai.", "pydantic_ai"),
        "tasks.integrations.pydantic_ai",
        lambda obj: callable(getattr(obj, "run", None)),
    ),
]


def framework_kind(obj: object) -> FrameworkKind | None:
    """The framework kind of ``obj``, or None (phase handlers, or nothing we run)."""
    if isinstance(obj, ModuleType):
        return None
    module = type(obj).__module__ or ""
    for kind in FRAMEWORKS:
        if module.startswith(kind.prefixes) and kind.looks_like(obj):
            return kind
    return None


def kind_of(obj: object) -> str:
    """``phases``, or the framework kind's name."""
    found = framework_kind(obj)
    return PHASES if found is None else found.name


def import_target(target: str) -> object:
    """The object ``dotted.path[:attribute]`` names (``dotted.path`` alone: a module, or
    a module's attribute, as AGENTSTATE_AGENT is read)."""
    if target.startswith(FILE_TARGET):
        return _from_file(target.removeprefix(FILE_TARGET))
    module_name, colon, attribute = target.partition(":")
    if not colon:
        return import_dotted(target)
    try:
        value: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise AgentStateError(f"cannot import agent {target!r}: {exc}") from exc
    return value


def _from_file(spec: str) -> object:
    """``attribute`` of the Python file ``/path/file.py`` (``/path/file.py:attribute``),
    loaded once as a module of its own (as LangGraph's server loads a graph's file)."""
    path, _, attribute = spec.rpartition(":")
    name = "agentstate_graph_" + hashlib.sha1(path.encode()).hexdigest()[:12]  # noqa: S324
    module = sys.modules.get(name)
    if module is None:
        found = importlib.util.spec_from_file_location(name, path)
        if found is None or found.loader is None:
            raise AgentStateError(f"cannot load graph file {path!r}")
        module = importlib.util.module_from_spec(found)
        sys.modules[name] = module
        try:
            found.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise AgentStateError(f"cannot load graph file {path!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise AgentStateError(f"graph file {path!r} has no {attribute!r}") from exc


def _runnable(name: str, target: str, settings: Settings) -> tuple[str, TurnAgent]:
    obj = import_target(target)
    kind = framework_kind(obj)
    if kind is None:
        return PHASES, Agent(obj, target)
    try:
        integration = importlib.import_module(kind.module)
    except ImportError as exc:
        raise AgentStateError(
            f"agent {name!r} is a {kind.name} agent, and its integration cannot be imported "
            f"({exc}); install agentstate-celery[{kind.name}]"
        ) from exc
    from tasks.agents.framework import FrameworkAgent

    adapter = integration.make_adapter(obj, name, settings)
    return kind.name, FrameworkAgent(name, adapter, settings)


@dataclass
class Registry:
    """The configured agents, imported once per process."""

    agents: AgentSet
    kinds: dict[str, str]


_registries: dict[tuple[str, str, str], Registry] = {}


def registry(settings: Settings) -> Registry:
    """The agents ``settings`` configure (imported and checked once per process)."""
    key = (settings.agent, settings.agents, settings.langgraph_config)
    found = _registries.get(key)
    if found is None:
        kinds = {DEFAULT_AGENT: PHASES}
        named: dict[str, TurnAgent] = {}
        for name, target in settings.agent_targets.items():
            kinds[name], named[name] = _runnable(name, target, settings)
        found = _registries[key] = Registry(AgentSet(load_agent(settings.agent), named), kinds)
    return found


def agent_set(settings: Settings) -> AgentSet:
    """Every agent of the deployment, for the turn engine."""
    return registry(settings).agents


def list_agents(settings: Settings) -> list[Document]:
    """``[{"name", "kind"}]``: ``default`` first, then AGENTSTATE_AGENTS in order."""
    return [{"name": name, "kind": kind} for name, kind in registry(settings).kinds.items()]


def checked_agent(settings: Settings, agent: object) -> str | None:
    """The agent a message names, checked (None: the session's own, or the default for a
    new session); BadInputError naming the agents if there is no such agent."""
    if agent is None:
        return None
    names = [DEFAULT_AGENT, *settings.agent_targets]
    if not isinstance(agent, str) or agent not in names:
        raise BadInputError(f"unknown agent {agent!r}; the agents are {', '.join(names)}")
    return agent
