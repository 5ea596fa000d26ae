"""The phase-handler protocol: how an agent plugs into the turn engine.

An agent is a module (named by ``AGENTSTATE_AGENT``) with one function per work phase:
``understanding``, ``planning``, ``retrieving``, ``executing``, ``evaluating`` and
``generating``. Each takes a :class:`PhaseContext` and returns a :class:`PhaseResult`:
what changed and the FSM trigger to fire. Handlers do not write anything themselves;
the engine commits their result together with the phase's revision bump, so a duplicate
delivery can never apply it twice. A handler decorated with :func:`quick` promises to
finish in milliseconds, which lets the ``inline`` hop policy run it without a broker hop.

A whole agent, as small as it gets (the phases it leaves out fire their default
trigger, see :data:`DEFAULT_TRIGGERS`; ``examples/shout_agent.py`` is a fuller one)::

    # loud.py, run with AGENTSTATE_AGENT=loud
    from state.agent import PhaseContext, PhaseResult, quick

    @quick
    def generating(ctx: PhaseContext) -> PhaseResult:
        return PhaseResult("response_sent", reply=ctx.message.upper())

The triggers each phase may fire are the FSM table (``state.machine.TRANSITIONS``):
understanding -> ``intent_clear`` | ``need_clarification``; planning -> ``plan_ready``;
retrieving -> ``context_ready``; executing -> ``tools_complete`` (or None with a
``workflow`` to wait for); evaluating -> ``result_good`` | ``retry_needed`` (executing
runs at most 3 times per turn); generating -> ``response_sent``; any phase ->
``error_occurred`` (the turn ends with the result's ``reply``, or an apology). A handler
that raises ends the turn with an apology (the cause is kept in
``metadata.last_error``); so does a trigger the table does not allow from the phase, or
a result that cannot be stored. docs/guides/agents.md says the same at length.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, TypeVar

from state.documents.codec import Document
from state.errors import AgentDefinitionError, AgentStateError, UnknownTriggerError
from state.machine import TRIGGERS, WORK_PHASES, Phase, Trigger

# The trigger each phase fires when a handler is missing (an agent may define fewer).
DEFAULT_TRIGGERS: dict[str, str] = {
    Phase.UNDERSTANDING: Trigger.INTENT_CLEAR,
    Phase.PLANNING: Trigger.PLAN_READY,
    Phase.RETRIEVING: Trigger.CONTEXT_READY,
    Phase.EXECUTING: Trigger.TOOLS_COMPLETE,
    Phase.EVALUATING: Trigger.RESULT_GOOD,
    Phase.GENERATING: Trigger.RESPONSE_SENT,
}


# The keys of the turn's context (``context_window``) that the engine writes itself. A
# handler reads them through PhaseContext (``message``, ``message_id``, ``attempt``,
# ``approval``; ``workflow`` is the finished workflow ``workflow_id`` names); a result
# that changes one ends its turn with an apology naming the key (state.turns.rules).
ENGINE_CONTEXT_KEYS: frozenset[str] = frozenset(
    {"message", "message_id", "attempt", "workflow_id", "approval_id", "approval"}
)


def suggestion(name: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the choice nearest ``name``, or an empty string."""
    close = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass
class PhaseContext:
    """What a handler may read about the turn it works on.

    Reading the history or the user's state is lazy: nothing is fetched unless the
    handler asks. Mutating these values changes nothing stored; return a PhaseResult.

    Attributes:
        session_id, user_id: whose conversation this is.
        phase: the phase this handler runs in (``planning``, ...).
        message, message_id: the user message the turn answers.
        context: the turn's scratch space (``context_window``), as earlier phases left it,
            with the engine's own keys (:data:`ENGINE_CONTEXT_KEYS`) among them.
        tool_results, pending_actions: as earlier phases set them.
        metadata: the session's metadata (``turn`` holds this turn's path through the FSM).
        workflow: in ``executing``, the finished workflow this turn waited for, if any.
        attempt: 1, then 2, 3 after ``retry_needed`` sent the turn back to executing.
        approval: in the one phase right after a person decided the approval this turn
            asked for (``executing`` if approved, ``generating`` if rejected), the
            decision: ``{approval_id, action, args, decision, approved, by, note}``;
            None in every other phase, so an approved action is run once.

    :meth:`emit` adds an event to the session's event log (``AgentClient.events``); it is
    committed with the phase, or not at all if the phase fails. :meth:`stream` sends a
    chunk of the answer to followers at once, through Redis, never stored.

    Example::

        def retrieving(ctx: PhaseContext) -> PhaseResult:
            last = ctx.recent_messages(4)
            facts = ctx.user_state().get("memories", [])
            return PhaseResult("context_ready", context={"recent": last, "facts": facts})
    """

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
    approval: Document | None = None
    history_reader: Callable[[int], list[Document]] | None = None
    user_state_reader: Callable[[], Document] | None = None
    event_sink: Callable[[str, Document | None], None] | None = None
    stream_sink: Callable[[str], None] | None = None

    def recent_messages(self, count: int = 10) -> list[Document]:
        """The last history items of the session (one indexed query).

        Args:
            count: how many items, at most.

        Returns:
            ``{role, content, timestamp, metadata}`` items, oldest first.
        """
        return self.history_reader(count) if self.history_reader else []

    def user_state(self) -> Document:
        """The user's persistent state (layer 3), migrated to the current schema.

        Returns:
            The state document ({} for a user with none). Change it through
            ``PhaseResult.user_state``, never by mutating this copy.
        """
        return self.user_state_reader() if self.user_state_reader else {}

    def emit(self, kind: str, data: Document | None = None) -> None:
        """Add an event to the session's log, committed with this phase's result (and
        dropped with it if the phase fails). Followers of ``AgentClient.events`` get it
        as soon as the phase commits.

        Args:
            kind: a short name: a lowercase letter, then lowercase letters, digits, ``_``
                or ``.`` (at most 64); agentstate's own kinds (``reply``, ...) are refused.
            data: a JSON object of at most AGENTSTATE_MAX_EVENT_BYTES (16 KiB) when
                serialized; a copy is kept.

        Raises:
            InvalidPayloadError: a bad kind, data that is not a small JSON object, or more
                than AGENTSTATE_MAX_EVENTS_PER_PHASE events in one phase. Raised from the
                handler, it ends the turn with an apology like any other error.

        Example::

            def executing(ctx: PhaseContext) -> PhaseResult:
                ctx.emit("tool.called", {"tool": "search", "query": ctx.message})
                return PhaseResult("tools_complete")
        """
        if self.event_sink is not None:
            self.event_sink(kind, data)

    def stream(self, text: str) -> None:
        """Send ``text`` to the session's followers now, as the next chunk of the answer
        to :attr:`message_id` (``AgentClient.events(..., follow=True, tokens=True)``).

        Chunks go through Redis only: nothing is written to the database, and they are
        not in the event log; the ``reply`` event carries the whole text, so stream the
        reply as you write it and return it whole in ``PhaseResult.reply``. Chunks of a
        phase that fails, or of a turn that is cancelled, stay sent: followers then get
        the event that says so. A phase run again (its worker lost) streams again.

        Args:
            text: the chunk (empty text sends nothing).

        Raises:
            InvalidPayloadError: ``text`` is not a string, or the turn's chunks would pass
                AGENTSTATE_MAX_STREAM_BYTES. Raised from the handler, it ends the turn
                with an apology like any other error.

        Example::

            def generating(ctx: PhaseContext) -> PhaseResult:
                words = []
                for word in my_model.stream(ctx.message):
                    ctx.stream(word)
                    words.append(word)
                return PhaseResult("response_sent", reply="".join(words))
        """
        if self.stream_sink is not None:
            self.stream_sink(text)


@dataclass
class PhaseResult:
    """What a handler changed, and the trigger to fire.

    The engine commits all of it with the phase's revision bump, in one transaction.

    Attributes:
        trigger: the FSM trigger to fire (see the module docstring); None only from
            ``executing`` together with ``workflow``, to wait for that workflow. A name
            that is no trigger at all raises UnknownTriggerError here, where the result
            is built, naming the nearest trigger.
        reply: the assistant's answer, used when the turn ends (idle) or asks for a
            clarification; a turn that ends without one gets a placeholder.
        context: keys merged into the turn's ``context_window``. The engine's own keys
            (:data:`ENGINE_CONTEXT_KEYS`: ``message``, ``message_id``, ``attempt``,
            ``workflow_id``, ``approval_id``, ``approval``) may be passed back unchanged
            (``{**ctx.context, ...}``) but not changed: a result that changes one ends
            its turn with an apology naming the key.
        tool_results, pending_actions, active_tools: replace the stored lists when given.
        metadata: keys merged into the session's metadata.
        user_state: a function from the user's persistent state to its new value, run
            inside the commit's transaction with the row locked (no lost updates).
        workflow: a workflow spec to start, in the same transaction (see docs/guides/workflows.md).
        approval: ask a person first: ``{"action": str, "args": dict, "ttl_s": float}``
            (``ttl_s`` optional, default AGENTSTATE_APPROVAL_TTL). From ``planning`` or
            ``executing``, with no trigger (or ``need_approval``): the session rests in
            ``awaiting_approval`` until someone decides (``AgentClient.decide``) or the
            request expires (rejected). Approved, the turn goes on to ``executing``;
            rejected, to ``generating``; that phase's handler gets ``ctx.approval``.

    Example::

        @quick
        def planning(ctx: PhaseContext) -> PhaseResult:
            return PhaseResult("plan_ready", pending_actions=[{"tool": "search"}])

    Asking before a risky action, and doing it once approved::

        def planning(ctx: PhaseContext) -> PhaseResult:
            return PhaseResult(approval={"action": "refund", "args": {"order": 42}})

        def executing(ctx: PhaseContext) -> PhaseResult:
            if ctx.approval and ctx.approval["approved"]:
                refund(ctx.approval["args"]["order"], key=ctx.approval["approval_id"])
            return PhaseResult("tools_complete")
    """

    trigger: str | None = None
    reply: str | None = None
    context: Document = field(default_factory=dict)
    tool_results: list[Any] | None = None
    pending_actions: list[Any] | None = None
    active_tools: list[Any] | None = None
    metadata: Document = field(default_factory=dict)
    user_state: Callable[[Document], Document] | None = None
    workflow: Document | None = None
    approval: Document | None = None

    def __post_init__(self) -> None:
        trigger = self.trigger
        if trigger is None or (isinstance(trigger, str) and trigger in TRIGGERS):
            return
        if not isinstance(trigger, str):
            raise UnknownTriggerError(
                f"PhaseResult trigger must be a trigger's name, not {type(trigger).__name__}"
            )
        raise UnknownTriggerError(
            f"PhaseResult: unknown trigger {trigger!r}{suggestion(trigger, TRIGGERS)}; "
            f"the triggers are {', '.join(TRIGGERS)}"
        )


class PhaseHandler(Protocol):
    """One phase of an agent: a function named after its phase.

    Args:
        ctx: what the handler may read (:class:`PhaseContext`).

    Returns:
        A :class:`PhaseResult`. Raising ends the turn with an apology, once.
    """

    def __call__(self, ctx: PhaseContext) -> PhaseResult: ...


H = TypeVar("H", bound=Callable[..., Any])


def quick(handler: H) -> H:
    """Declare that ``handler`` finishes in milliseconds (no I/O that may stall).

    Under ``AGENTSTATE_HOP_POLICY=inline`` a quick phase runs in the same worker right
    after the phase before it (still one checkpoint per phase; on Postgres the commits of
    consecutive quick phases are sent together, so a quick handler must have no side
    effects); its lock is not renewed while it runs (unless AGENTSTATE_PHASE_TIME_LIMIT
    could outlast it), so it must really be quick. Like any handler but executing's, it
    is held to AGENTSTATE_PHASE_TIME_LIMIT. On a workflow action (under ``@action``) it
    means the step is read, not claimed, and commits once; under the inline policy a
    quick step runs a quick step it released in the same delivery.

    Args:
        handler: a phase handler or a workflow action.

    Returns:
        The same handler, marked.

    Example::

        @quick
        def evaluating(ctx: PhaseContext) -> PhaseResult:
            return PhaseResult("result_good")
    """
    handler.quick = True  # type: ignore[attr-defined]
    return handler


def is_quick(handler: Callable[..., Any] | None) -> bool:
    """Whether ``handler`` declared itself quick (a missing handler is quick)."""
    return handler is None or bool(getattr(handler, "quick", False))


class Agent:
    """The handlers of one agent, looked up by phase.

    A module that defines a function whose name is a near miss of a phase it does not
    define (``generatng``) is refused (AgentDefinitionError, naming the phase it meant):
    the handler would be silently ignored and the phase would fire its default trigger.
    A helper function of such a name starts with ``_``.
    """

    def __init__(self, source: ModuleType | object, name: str) -> None:
        self.name = name
        self.handlers: dict[str, PhaseHandler | None] = {
            phase: getattr(source, phase, None) for phase in WORK_PHASES
        }
        phases = ", ".join(WORK_PHASES)
        if not any(self.handlers.values()):
            raise AgentDefinitionError(
                f"agent {name!r} defines none of the phases {phases}"
                + _near_misses(source, WORK_PHASES)
            )
        missing = [phase for phase, handler in self.handlers.items() if handler is None]
        near = _near_misses(source, missing)
        if near:
            raise AgentDefinitionError(f"agent {name!r}{near}")

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


# How close a function's name must be to a phase's to be taken for a misspelling of it:
# "generatng" (0.95) and "understandng" are, "generate" (0.78) and "plan" are not.
_NEAR_MISS = 0.8


def _near_misses(source: ModuleType | object, phases: Iterable[str]) -> str:
    """``: 'generatng' is not a phase (did you mean 'generating'?) ...`` for each public
    function of ``source`` whose name is close to one of ``phases``; else ''."""
    wanted = list(phases)
    found = []
    for attribute in _public_functions(source):
        if attribute in WORK_PHASES:
            continue
        hint = suggestion(attribute, wanted, cutoff=_NEAR_MISS)
        if hint:
            found.append(f"{attribute!r} is not a phase{hint}")
    if not found:
        return ""
    return (
        ": "
        + "; ".join(found)
        + f" (the phases are {', '.join(WORK_PHASES)}; start a helper's name with _)"
    )


def _public_functions(source: ModuleType | object) -> list[str]:
    own = getattr(source, "__name__", None) if isinstance(source, ModuleType) else None
    names = []
    for attribute in dir(source):
        if attribute.startswith("_"):
            continue
        value = getattr(source, attribute, None)
        if not callable(value) or inspect.isclass(value):
            continue
        # A module's imports are not its handlers: only what it defines itself counts.
        if own is not None and getattr(value, "__module__", own) != own:
            continue
        names.append(attribute)
    return names


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
