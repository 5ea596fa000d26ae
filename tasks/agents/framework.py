"""A framework's agent (LangGraph, Pydantic AI...) as phases of agentstate's FSM.

Its run is the turn's ``executing`` phase: a turn of such an agent walks the same phases as
every other turn (understanding, planning, retrieving, executing, evaluating, generating),
so it is locked, durable, cancellable, double-texted, streamed, recovered and erased the
same way. Every phase but the run is quick (no broker hop under the inline policy).

- ``understanding`` gives the turn its executing deadline: AGENTSTATE_FRAMEWORK_TURN_TIMEOUT
  instead of AGENTSTATE_EXECUTION_TIMEOUT (a whole run, not one tool call).
- ``executing`` runs the adapter: its reply goes to ``generating``; an approval it asks for
  parks the turn (``awaiting_approval``), and once approved ``executing`` runs the adapter
  again with the decision.
- ``generating`` answers with the reply; after a rejection (the FSM goes straight there) it
  first runs the adapter with the decision, so the framework hears the "no". A run that
  asks again after a rejection ends the turn with a reply saying so: the FSM asks for
  approval from planning or executing only.
"""

from __future__ import annotations

from config import Settings
from state.agent import DEFAULT_TRIGGERS, PhaseContext, PhaseResult
from state.machine import Phase, Trigger
from state.turns.rules import TURN_TIMEOUT_KEY
from tasks.agents.registry import FrameworkAdapter, FrameworkTurn, TurnOutcome

REPLY_KEY = "framework_reply"  # the run's reply, from executing to generating
ASKED_AGAIN = "The request was declined, and the agent asked again; send a message to go on."
NO_REPLY = "(the agent gave no reply)"


class FrameworkAgent:
    """The turn engine's view of a framework adapter (``state.agent_set.TurnAgent``)."""

    def __init__(self, name: str, adapter: FrameworkAdapter, settings: Settings) -> None:
        self.name = name
        self.adapter = adapter
        self.turn_timeout = settings.framework_turn_timeout

    def is_quick(self, phase: str) -> bool:
        """Every phase but those that may run the framework."""
        return phase not in (Phase.EXECUTING, Phase.GENERATING)

    def run(self, phase: str, ctx: PhaseContext) -> PhaseResult:
        """Run ``phase`` of a turn of this agent."""
        if phase == Phase.UNDERSTANDING:
            return PhaseResult(Trigger.INTENT_CLEAR, context={TURN_TIMEOUT_KEY: self.turn_timeout})
        if phase == Phase.EXECUTING:
            outcome = self.adapter.run_turn(FrameworkTurn(ctx, ctx.approval))
            if outcome.approval is not None:
                return PhaseResult(approval=outcome.approval)
            return PhaseResult(Trigger.TOOLS_COMPLETE, context={REPLY_KEY: outcome.reply})
        if phase == Phase.GENERATING:
            return PhaseResult(Trigger.RESPONSE_SENT, reply=self._reply(ctx))
        return PhaseResult(DEFAULT_TRIGGERS[phase])

    def _reply(self, ctx: PhaseContext) -> str:
        if ctx.approval is not None and not ctx.approval.get("approved"):
            outcome: TurnOutcome = self.adapter.run_turn(FrameworkTurn(ctx, ctx.approval))
            if outcome.approval is not None:
                return ASKED_AGAIN
            return outcome.reply or NO_REPLY
        reply = ctx.context.get(REPLY_KEY)
        return str(reply) if reply else NO_REPLY
