"""Calling an agent's handler for one phase into a draft: the context it is given, the
time limit it runs under, and what a failure or a late result makes of its turn.

The turn engine (``state.turns.engine``) decides whether and from which snapshot a phase
runs; this module only runs it. A handler is the agent's code: whatever it raises ends
its turn with an apology, never the worker.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from functools import partial

from state import observe
from state.agent import PhaseContext
from state.agent_set import AgentSet
from state.documents.codec import Document
from state.errors import PhaseTimeLimitError, StaleStateError
from state.events.log import custom_event
from state.machine import Phase, Trigger
from state.turns import rules
from state.turns.deadlines import alarm, deadline_passed, time_limit
from state.turns.draft import Draft
from state.turns.interventions import TurnInterventions
from state.turns.services import TurnServices

logger = logging.getLogger(__name__)


class PhaseHandlers:
    """Runs the agent's handler of a phase into its draft."""

    def __init__(
        self, services: TurnServices, agents: AgentSet, interventions: TurnInterventions
    ) -> None:
        self.services = services
        self.agents = agents
        self.interventions = interventions

    def handle(self, phase: Phase, draft: Draft) -> None:
        """Run the handler into ``draft``; a failure or a late result ends the turn."""
        try:
            self._run_handler(phase, draft)
        except StaleStateError:
            raise
        except PhaseTimeLimitError as exc:
            rules.fail_turn(draft, Trigger.TIMEOUT, rules.TIMEOUT_REPLY, str(exc))
            return
        except Exception as exc:
            # The handler (or what it returned) failed: the agent's fault, not ours.
            # With its traceback, at WARNING: seen at a worker's default log level.
            session_id = draft.snap.session_id
            logger.warning(
                "session %s: %s handler failed: %r", session_id, phase, exc, exc_info=True
            )
            detail = f"{type(exc).__name__}: {exc}"
            rules.fail_turn(draft, Trigger.ERROR_OCCURRED, rules.ERROR_REPLY, detail)
            return
        if deadline_passed(draft.snap, self.services.deadline_grace(draft.snap)):
            # The handler overran: its result arrives too late to count.
            rules.fail_turn(draft, Trigger.TIMEOUT, rules.TIMEOUT_REPLY, rules.DEADLINE_PASSED)

    def _run_handler(self, phase: Phase, draft: Draft) -> None:
        context = self._context(phase, draft)
        with alarm(draft.snap, self.services.dispatcher), self._time_limit(phase, draft):
            started = time.monotonic()
            result = self.agents.of(draft.snap.doc).run(phase, context)
        if phase != Phase.EXECUTING and time.monotonic() - started > self._limit_s:
            # Late: its result is refused, and its turn ends with an apology, once (if
            # the watchdog has ended it already, this commit finds the revision moved).
            raise PhaseTimeLimitError(self._overrun_cause(phase))
        rules.apply_result(
            phase,
            draft,
            result,
            settings=self.services.settings,
            known_actions=self.services.known_actions,
        )
        draft.check_storable()

    @property
    def _limit_s(self) -> float:
        return self.services.settings.phase_time_limit

    def _overrun_cause(self, phase: Phase) -> str:
        return f"the {phase} handler ran past AGENTSTATE_PHASE_TIME_LIMIT ({self._limit_s:g}s)"

    def _time_limit(self, phase: Phase, draft: Draft) -> AbstractContextManager[None]:
        """Watch a handler (executing's has its durable deadline instead): if it has not
        returned by the limit, its worker's watchdog ends the turn. That commit needs no
        lock and is fenced by the revision, so the turn ends once, whoever is first: the
        watchdog, or the handler's own late commit. Meanwhile the live worker holds the
        lock, so the sweep does not hand the stuck phase to another worker to run again
        (a quick phase run from a carried snapshot holds none: by default this limit ends
        it long before AGENTSTATE_STUCK_AFTER, and a copy the sweep resumes meanwhile
        commits at most once, by the revision guard)."""
        if phase == Phase.EXECUTING:
            return nullcontext()
        snap, cause = draft.snap, self._overrun_cause(phase)

        def ring() -> bool:
            try:
                ended = self.interventions.end_overrun(draft.at_checkpoint(), cause)
            except StaleStateError:
                return False  # the turn moved on (the handler returned after all)
            observe.current.turn_ended(ended.turn or "failed")
            logger.warning("session %s: %s; its turn was ended", snap.session_id, cause)
            return False

        return time_limit(f"{snap.session_id}@{snap.revision}:{phase}", self._limit_s, ring)

    def _context(self, phase: Phase, draft: Draft) -> PhaseContext:
        snap = draft.snap
        sessions, users = self.services.sessions, self.services.users

        # Reads see this turn's commits held back so far: they land first.
        def history(n: int) -> list[Document]:
            draft.before_read()
            return sessions.history(snap.session_id, last=n)

        def user_state() -> Document:
            draft.before_read()
            return users.load_user_state(snap.user_id)

        return PhaseContext(
            session_id=snap.session_id,
            user_id=snap.user_id,
            phase=phase,
            message=str(draft.context.get("message", "")),
            message_id=str(draft.context.get("message_id", "")),
            context=dict(draft.context),
            tool_results=list(draft.doc.get("tool_results") or []),
            pending_actions=list(draft.doc.get("pending_actions") or []),
            metadata=dict(draft.metadata),
            workflow=self._finished_workflow(draft) if phase == Phase.EXECUTING else None,
            attempt=int(draft.context.get("attempt", 1)),
            approval=draft.context.get(rules.APPROVAL_KEY),
            history_reader=history,
            user_state_reader=user_state,
            event_sink=partial(self._emit, draft),
            stream_sink=partial(self._stream, draft),
        )

    def _emit(self, draft: Draft, kind: str, data: Document | None) -> None:
        settings = self.services.settings
        draft.emit(
            custom_event(kind, data, settings.max_event_bytes), settings.max_events_per_phase
        )

    def _stream(self, draft: Draft, text: str) -> None:
        message_id = str(draft.context.get("message_id") or "")
        started = str((draft.metadata.get("turn") or {}).get("started_at") or "")
        if self.services.tokens.send(draft.snap.session_id, message_id, started, text) > 0:
            draft.streamed = message_id

    def _finished_workflow(self, draft: Draft) -> Document | None:
        workflow_id = draft.context.get("workflow_id")
        return self.services.workflows.document(workflow_id) if workflow_id else None
