"""Pydantic AI agents as agentstate turns, durable (extra ``pydantic-ai``).

A Pydantic AI ``Agent`` named in AGENTSTATE_AGENTS runs as a turn's ``executing`` phase
(``tasks.agents.framework``) with the session's history. Durability is built on Pydantic
AI's public durable-execution interface, as its Temporal, DBOS and Prefect integrations
are: :class:`AgentstateDurability` is a ``BaseDurabilityCapability`` whose operation
backend records each durable unit (every model request, every tool call) in the turn's
journal (``state.turns.journal``) before the next begins. A turn whose worker died is
resumed by the sweep and runs the agent again: each finished step's result comes from the
journal, so the model is not asked again and no finished tool runs twice.

- Approval: a tool that requires approval (``requires_approval=True`` or
  ``ApprovalRequired``; the agent's ``output_type`` includes ``DeferredToolRequests``, as
  Pydantic AI requires) makes the turn wait for an agentstate approval (``action`` = the
  tool's name, ``args`` = its arguments), one per call. Approved, the tool runs; rejected,
  the model gets ``ToolDenied`` with the person's note.
- Streaming: the text deltas of every model response are ``ctx.stream`` chunks.
- The reply is the run's output (``str()`` of it when it is not text).

Attach the capability yourself (``Agent(..., capabilities=[AgentstateDurability()])``) to
name its steps, or leave it: an agent without it gets one bound for agentstate's runs.

Tested with ``pydantic-ai-slim`` 2.78.0.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    EventStreamHandlerId,
    JournalCallableOperationBackend,
    RoleBasedOperationConfig,
)
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    UserPromptPart,
)
from pydantic_ai.tools import RunContext

from config import Settings
from state.agent import PhaseContext
from state.documents.codec import Document
from state.errors import AgentStateError
from state.storage.backend import default_backend
from state.turns.journal import DECIDED, ENDED, Journal
from tasks.agents.registry import FrameworkTurn, TurnOutcome

HISTORY_ITEMS = 100  # the session's latest messages a run is given
DENIED = "The person asked declined this tool call."


@dataclass
class _Turn:
    """The run going on in this task: its journal, its run number, its chunks' sink."""

    journal: Journal
    run: int
    ctx: PhaseContext
    seen: dict[str, int] = field(default_factory=dict)  # occurrences of each step name

    def next_place(self, name: str) -> int:
        n = self.seen.get(name, 0)
        self.seen[name] = n + 1
        return n


_current: ContextVar[_Turn | None] = ContextVar("agentstate_pydantic_ai_turn", default=None)


class _JournalBackend(JournalCallableOperationBackend[dict[str, Any]]):
    """Each durable unit of a run is a journal step: replayed if recorded, else done and
    recorded before the run goes on."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: dict[str, Any],
    ) -> object:
        turn = _current.get()
        if turn is None or isinstance(operation_id, EventStreamHandlerId):
            # Outside a turn, and for the event handler (it only streams chunks, which are
            # not durable anyway), the unit just runs.
            return await body()
        n = turn.next_place(name)
        found, payload = turn.journal.get(turn.run, name, n)
        if found:
            turn.journal.replayed += 1
            return payload
        payload = await body()
        turn.journal.recorded += 1
        return turn.journal.put(turn.run, name, n, payload)


async def _stream_text(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    """Send the text of model responses to the turn's followers as it comes."""
    turn = _current.get()
    async for event in events:
        text = ""
        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
            text = event.part.content
        elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
            text = event.delta.content_delta
        if turn is not None and text:
            turn.ctx.stream(text)


class AgentstateDurability(BaseDurabilityCapability[Any]):
    """Pydantic AI's durability capability for agentstate turns (module docstring)."""

    engine_spec = DurabilityEngineSpec(
        engine_name="agentstate",
        durable_unit_noun="step",
        durable_container_noun="turn",
        # Steps are journaled as JSON in the database.
        codec=JSON_CODEC,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        journal_discovery=True,
        # One tool call at a time: the order of a run's steps is the same every time.
        sequential_tools_in_durable_context=True,
        tool_config_key=None,
    )

    def __init__(self, *, name: str | None = None) -> None:
        super().__init__(event_stream_handler=_stream_text, name=name)

    @property
    def in_durable_context(self) -> bool:
        return _current.get() is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        return _JournalBackend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(model={}, event={}, capability={}, tool={}),
        )


class PydanticAIAdapter:
    """A Pydantic AI agent as agentstate runs it (``tasks.agents.registry``)."""

    def __init__(self, agent: Agent[Any, Any], name: str, settings: Settings) -> None:
        self.agent = agent
        self.settings = settings
        # An agent built without the capability gets one for agentstate's runs (through
        # Pydantic AI's ``override``, which binds it as construction would).
        self.added: AgentstateDurability | None = None
        if AgentstateDurability.from_agent(agent) is None:
            self.added = AgentstateDurability(name=agent.name or name)

    def run_turn(self, turn: FrameworkTurn) -> TurnOutcome:
        """Run (or resume, from its journal) the turn's agent runs until a reply, or until
        a tool call waits for a person."""
        ctx = turn.ctx
        engine = default_backend(self.settings).engine
        journal = Journal.load(engine, ctx.session_id, ctx.message_id)
        return asyncio.run(self._turn(journal, turn))

    async def _turn(self, journal: Journal, turn: FrameworkTurn) -> TurnOutcome:
        run, resume = 0, None
        decision = turn.decision
        while True:
            found, ended = journal.get(run, ENDED, 0)
            if not found:
                output, messages = await self._run(journal, run, turn.ctx, resume)
                if not isinstance(output, DeferredToolRequests):
                    return TurnOutcome(reply=output if isinstance(output, str) else str(output))
                ended = journal.put(run, ENDED, 0, _ending(output, messages))
            decisions = journal.decisions(run)
            asked = ended["approvals"]
            if (
                decision is not None
                and len(decisions) < len(asked)
                and not journal.decided(str(decision["approval_id"]))
            ):
                decisions.append(journal.put(run, DECIDED, len(decisions), _decided(decision)))
                decision = None
            if len(decisions) < len(asked):
                call = asked[len(decisions)]
                return TurnOutcome(approval={"action": call["tool_name"], "args": call["args"]})
            resume = (ended["messages"], _results(asked, decisions))
            run += 1

    async def _run(
        self,
        journal: Journal,
        run: int,
        ctx: PhaseContext,
        resume: tuple[list[Any], DeferredToolResults] | None,
    ) -> tuple[Any, list[ModelMessage]]:
        token = _current.set(_Turn(journal, run, ctx))
        try:
            with self._durable():
                return await self._run_once(ctx, resume)
        finally:
            _current.reset(token)

    def _durable(self) -> AbstractContextManager[None]:
        if self.added is None:
            return nullcontext()
        capabilities = [*self.agent.root_capability.capabilities, self.added]
        return self.agent.override(capabilities=capabilities)

    async def _run_once(
        self, ctx: PhaseContext, resume: tuple[list[Any], DeferredToolResults] | None
    ) -> tuple[Any, list[ModelMessage]]:
        if resume is None:
            result = await self.agent.run(ctx.message, message_history=_history(ctx))
        else:
            messages = ModelMessagesTypeAdapter.validate_python(resume[0])
            result = await self.agent.run(message_history=messages, deferred_tool_results=resume[1])
        return result.output, result.all_messages()


def make_adapter(obj: object, name: str, settings: Settings) -> PydanticAIAdapter:
    """The adapter for the Pydantic AI agent ``obj`` (the registry's extension point)."""
    if not isinstance(obj, Agent):
        raise AgentStateError(f"agent {name!r} is not a Pydantic AI Agent ({type(obj).__name__})")
    return PydanticAIAdapter(obj, name, settings)


def _history(ctx: PhaseContext) -> list[ModelMessage]:
    """The session's latest messages before this turn's, as Pydantic AI messages."""
    items = ctx.recent_messages(HISTORY_ITEMS)
    if items and items[-1].get("role") == "user" and items[-1].get("content") == ctx.message:
        items = items[:-1]
    history: list[ModelMessage] = []
    for item in items:
        text = str(item.get("content", ""))
        if item.get("role") == "user":
            history.append(ModelRequest(parts=[UserPromptPart(content=text)]))
        elif item.get("role") == "assistant":
            history.append(ModelResponse(parts=[TextPart(content=text)]))
    return history


def _ending(output: DeferredToolRequests, messages: list[ModelMessage]) -> Document:
    if output.calls:
        names = ", ".join(call.tool_name for call in output.calls)
        raise AgentStateError(
            f"the agent deferred tool calls to be run elsewhere ({names}); agentstate runs "
            "tools in the turn, and asks people only for approvals"
        )
    return {
        "messages": ModelMessagesTypeAdapter.dump_python(messages, mode="json"),
        "approvals": [
            {"tool_call_id": c.tool_call_id, "tool_name": c.tool_name, "args": c.args_as_dict()}
            for c in output.approvals
        ],
    }


def _decided(decision: Document) -> Document:
    return {
        "approval_id": str(decision["approval_id"]),
        "approved": bool(decision.get("approved")),
        "by": decision.get("by"),
        "note": decision.get("note"),
    }


def _results(asked: list[Document], decisions: list[Document]) -> DeferredToolResults:
    results = DeferredToolResults()
    for call, decided in zip(asked, decisions, strict=True):
        results.approvals[call["tool_call_id"]] = (
            True if decided["approved"] else ToolDenied(decided.get("note") or DENIED)
        )
    return results


@contextmanager
def turn_scope(journal: Journal, ctx: PhaseContext, run: int = 0) -> Iterator[None]:
    """Run code as inside a turn's run (tests and benchmarks drive the capability so)."""
    token = _current.set(_Turn(journal, run, ctx))
    try:
        yield
    finally:
        _current.reset(token)
