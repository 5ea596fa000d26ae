"""The client API for apps: send messages, read sessions, run workflows, user state.

``AgentClient()`` reads Settings. Nothing here runs an agent: messages are stored
durably, then enqueued for the workers; the recovery sweep re-enqueues anything the
broker lost, so a message accepted here is never lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property, partial

from celery import Celery
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import InterfaceError, OperationalError

from config import Settings, get_settings, redact_url
from config.brokers import broker_for
from state.documents.codec import Document, require_object
from state.events.feed import EventFeed
from state.events.push import Notifier, Waiter
from state.events.stream import TokenStream
from state.ids import new_id, validate_id
from state.machine import Phase
from state.sessions.agents import pin_agent
from state.sessions.inbox import Inbox
from state.sessions.store import SessionStore
from state.storage import keys
from state.storage.backend import Backend
from state.storage.identity import warn_if_workers_elsewhere
from state.store import PersistentStateManager
from state.turns.double_texting import DoubleTexting, MultitaskStrategy
from state.workflows.engine import WorkflowEngine
from state.workflows.served import ServedActions
from state.workflows.store import WorkflowStore
from tasks.actions import get_action, known_actions
from tasks.agents.registry import checked_agent, list_agents
from tasks.app import app as default_app
from tasks.app import make_app
from tasks.client.approvals import ApprovalControl
from tasks.client.automation import Automation
from tasks.client.control import checked_message
from tasks.client.lifecycle import Lifecycle
from tasks.client.reads import SessionReads, finished_workflow
from tasks.client.timeline import Timeline
from tasks.dispatch.dispatcher import CeleryDispatcher
from tasks.observability import metrics, tracing

logger = logging.getLogger(__name__)
# What a lost enqueue means to whoever reads the log: the message is stored, and the
# recovery sweep (the workers send it, or beat) re-sends it.
ENQUEUE_FAILED = (
    "enqueue failed (%s); the message is stored and the workers' recovery sweep re-sends it "
    "within AGENTSTATE_STUCK_AFTER + AGENTSTATE_SWEEP_INTERVAL of the broker's return"
)


class AgentClient(ApprovalControl, Timeline, Lifecycle, Automation):
    """What an app (web handler, script, notebook) uses to talk to agentstate.

    Run control (cancel, retry, listing) comes from ``tasks.client.control.RunControl``, with
    approvals and decisions on top of it from ``tasks.client.approvals.ApprovalControl``;
    events, revisions and forks from ``tasks.client.timeline.Timeline``; erasure from
    ``tasks.client.lifecycle.Lifecycle``; schedules and webhooks from
    ``tasks.client.automation.Automation``.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.backend = Backend.build(self.settings)
        self.sessions = SessionStore.for_engine(
            self.backend.engine, self.backend.cache, self.backend.statements
        )
        self.inbox = Inbox.for_engine(
            self.backend.engine,
            self.backend.statements,
            self.settings.max_queued_messages,
            self.settings.max_queued_messages_per_user,
        )
        self.users = PersistentStateManager(
            self.backend.redis, self.backend.engine, settings=self.settings
        )
        # The module's app was configured from the environment; other settings get theirs.
        celery: Celery = default_app if self.settings == get_settings() else make_app(self.settings)
        self.dispatcher = CeleryDispatcher(celery, broker_for(self.settings))
        self.notifier = Notifier(self.backend.redis, self.settings.events)
        self.tokens = TokenStream(self.backend.redis, self.settings)
        self.feed = EventFeed(
            self.backend.engine, self.backend.redis, self.settings.events, self.tokens
        )
        self.workflows = WorkflowEngine(
            WorkflowStore.for_engine(self.backend.engine, self.backend.statements),
            self.dispatcher,
            get_action,
            self.settings,
            self.notifier,
        )
        self.served_actions = ServedActions(self.backend.engine)
        self._database_checked = False
        metrics.count_elsewhere(self.backend.redis)  # a cancel here reaches a scraped counter
        self.reads = SessionReads(self.sessions, self.inbox, self.feed)

    # -- conversations ---------------------------------------------------------

    def create_session(self, user_id: str) -> str:
        """A new, empty session of ``user_id`` under an id minted here (random, never one
        anyone holds), returned. A multi-user app should let the service mint its ids:
        a chosen id another user holds is refused (``send_message`` raises NotFoundError),
        which tells a taken id from a free one."""
        validate_id(user_id, "user")
        session_id = new_id("s")
        self.sessions.create(session_id, user_id)
        return session_id

    def send_message(
        self,
        session_id: str,
        text: str,
        user_id: str,
        idempotency_key: str | None = None,
        multitask_strategy: str = "enqueue",
        *,
        agent: str | None = None,
    ) -> str:
        """Store the message durably, enqueue its turn, return its message id.

        ``agent`` names the agent (``list_agents``) of a new session; a session keeps the
        agent of its first message (the default one when it named none). None sends the
        message to the session's own agent; naming another agent than the session's
        raises BadInputError and stores nothing.

        With ``idempotency_key``, repeating the call (a retried request, a double click,
        racing callers) returns the first call's message id and starts no second turn;
        the same key with other text raises IdempotencyConflictError.

        ``multitask_strategy`` says what the message does to a busy session (a turn
        running, or messages waiting): ``"enqueue"`` waits its turn; ``"reject"`` raises
        SessionBusyError and stores nothing; ``"interrupt"`` cancels the running turn (as
        ``cancel_turn``) and the messages waiting, then runs; ``"rollback"`` removes the
        running turn and the waiting messages as if never sent, then runs
        (``state.turns.double_texting``).
        """
        strategy = checked_message(
            self.settings, session_id, text, user_id, idempotency_key, strategy=multitask_strategy
        )
        named = checked_agent(self.settings, agent)
        # The trace of the turn starts here (AGENTSTATE_OTEL): the kick carries it.
        with tracing.client_span(
            "agentstate.send_message", self.settings, **{"agentstate.session_id": session_id}
        ):
            if named is not None:
                pin_agent(self.backend.engine, session_id, user_id, named, self.backend.cache)
            return self._send_message(session_id, text, user_id, idempotency_key, strategy)

    def list_agents(self) -> list[Document]:
        """The deployment's agents, ``[{"name", "kind"}]``: ``default`` (AGENTSTATE_AGENT)
        first, then those of AGENTSTATE_AGENTS in order; ``kind`` is ``phases``,
        ``langgraph`` or ``pydantic-ai``. (Imports each agent once, to tell its kind.)"""
        return list_agents(self.settings)

    def _send_message(
        self,
        session_id: str,
        text: str,
        user_id: str,
        idempotency_key: str | None,
        strategy: MultitaskStrategy,
    ) -> str:
        self._check_workers_database()
        if strategy == MultitaskStrategy.ENQUEUE:
            item = self.inbox.accept(session_id, user_id, text, idempotency_key)
        else:
            item = self._double_texting.accept(session_id, user_id, text, idempotency_key, strategy)
        try:
            if item.needs_kick:  # else a running turn, or the one already kicked, takes it
                self._kick(session_id, item.session_revision)
        finally:
            # After the kick, which is what the turn waits for: its message_accepted event
            # is in, and a follower reads every event after its cursor whichever push
            # wakes it.
            self.notifier.session(session_id)
        return item.message_id

    def _check_workers_database(self) -> None:
        """Once per client: warn if the workers on our queue use another database (an app
        and workers started in different folders with the default SQLite file)."""
        if not self._database_checked:
            self._database_checked = True
            warn_if_workers_elsewhere(self.backend.redis, self.backend.engine, self.settings.queue)

    @cached_property
    def _double_texting(self) -> DoubleTexting:
        return DoubleTexting(self._interventions.services)

    def _kick(self, session_id: str, revision: int | None) -> None:
        try:
            # The revision only tells the worker which cached copy it may trust.
            self.dispatcher.phase(Phase.UNDERSTANDING, session_id, revision)
        except BrokerError as exc:
            # The message is durable; the recovery sweep will start its turn.
            logger.warning(ENQUEUE_FAILED, redact_url(str(exc)))

    def get_session(
        self,
        session_id: str,
        user_id: str | None = None,
        history_limit: int | None = None,
        before_seq: int | None = None,
        revision: int | None = None,
    ) -> Document | None:
        """The session (seed fields, ``phase``, ``_version``, history) or None.

        With ``user_id``, a session of another user reads as None, like an unknown id.
        The history is whole unless paged: the newest ``history_limit`` items before
        ``before_seq``, oldest first. Each item carries its ``seq``, so the next older page
        is ``before_seq=history[0]["seq"]``; ``history_limit=0`` reads the state alone.

        With ``revision``, the session as it was when that revision was committed: its
        document, its history up to then, and ``queued`` as it was then (NotFoundError if
        the revision is not kept; ``revisions()`` lists those that are).
        """
        validate_id(session_id, "session")
        if user_id is not None:
            validate_id(user_id, "user")
        return self.reads.session(session_id, user_id, history_limit, before_seq, revision)

    def wait_for_idle(
        self,
        session_id: str,
        timeout: float = 30.0,
        user_id: str | None = None,
        history_limit: int | None = None,
    ) -> Document:
        """Wait until the session rests (idle or clarifying, or its turn waits for an
        approval: ``awaiting_approval``) with nothing queued; return it
        as :meth:`get_session` does. Waiting reads only the phase and the queue; the
        document (its whole history unless ``history_limit``) is read once, at the end.
        A session of another ``user_id`` raises NotFoundError, like an unknown id."""
        validate_id(session_id, "session")
        if user_id is not None:
            validate_id(user_id, "user")
        seen: Document = {"phase": "unknown"}
        return _wait(
            partial(self.reads.rested, session_id, user_id, history_limit, seen),
            timeout,
            lambda: f"session {session_id} still in {seen['phase']!r}",
            self._waiter(keys.session_events(session_id)),
        )

    # -- workflows -------------------------------------------------------------

    def start_workflow(self, spec: Document, user_id: str | None = None) -> str:
        """Validate the whole spec (nothing is stored if it is bad), store it, start it.

        An action is known if this process registered it (AGENTSTATE_ACTION_MODULES) or a
        worker published it when it started. The workflow's owner is its session's user,
        or ``user_id`` when it names no session. A ``session_id`` that does not exist, or
        (``user_id`` given) is another user's, raises WorkflowSessionNotFoundError; asking
        for more approvals than AGENTSTATE_MAX_PENDING_APPROVALS leaves raises
        QuotaExceededError. Either way nothing is stored.
        """
        if user_id is not None:
            validate_id(user_id, "user")
        known = {*known_actions(self.settings.action_module_list), *self.served_actions.names()}
        wf = self.workflows.validate(spec, known)
        self._check_workers_database()
        try:
            return self.workflows.start(wf, user_id)
        except BrokerError as exc:
            # The workflow is stored; the recovery sweep dispatches its ready steps.
            logger.warning(ENQUEUE_FAILED, redact_url(str(exc)))
            return wf.workflow_id

    def get_workflow(self, workflow_id: str, user_id: str | None = None) -> Document | None:
        """The workflow with every step's status, outputs and retry count, or None.

        With ``user_id``, a workflow that user does not own reads as None, like an
        unknown id.
        """
        validate_id(workflow_id, "workflow")
        if user_id is not None:
            validate_id(user_id, "user")
        return self.workflows.store.document(workflow_id, user_id)

    def wait_for_workflow(
        self, workflow_id: str, timeout: float = 60.0, user_id: str | None = None
    ) -> Document:
        """Wait until every step is terminal; return the workflow. Waiting reads statuses
        and counts only; the document, payloads and all, is read once, at the end. A
        workflow ``user_id`` may not read raises NotFoundError, like an unknown id."""
        validate_id(workflow_id, "workflow")
        if user_id is not None:
            validate_id(user_id, "user")
        seen: Document = {"progress": "progress unknown"}
        return _wait(
            partial(finished_workflow, self.workflows.store, workflow_id, user_id, seen),
            timeout,
            lambda: f"workflow {workflow_id} unfinished ({seen['progress']})",
            self._waiter(keys.workflow_events(workflow_id)),
        )

    def _waiter(self, channel: str) -> Waiter:
        """Wakes on the push to ``channel`` (a slow poll covers a push that never came)."""
        return Waiter(self.backend.redis, [channel], self.settings.events)

    # -- persistent user state -------------------------------------------------

    def save_user_state(self, user_id: str, state: Document) -> None:
        """Replace the user's persistent state."""
        self.users.save_user_state(user_id, require_object(state, "user state"))

    def load_user_state(self, user_id: str) -> Document:
        """The user's persistent state ({} for an unknown user)."""
        return self.users.load_user_state(user_id)


def _wait(
    check: Callable[[], Document | None],
    timeout: float,
    describe: Callable[[], str],
    waiter: Waiter,
) -> Document:
    """Call ``check`` whenever ``waiter`` wakes until it returns something, or time out.
    The waiter subscribes before the check that may wait, so no push after it is missed
    (what is already there is found without subscribing)."""
    deadline = time.monotonic() + timeout
    with _outage_tolerated():
        found = check()
        if found is not None:
            return found
    with waiter:
        while True:
            with _outage_tolerated():
                found = check()
                if found is not None:
                    return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{describe()} after {timeout:g}s")
            waiter.wait(remaining)


@contextmanager
def _outage_tolerated() -> Iterator[None]:
    """While waiting, a database outage is a reason to look again later, not to give up."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        logger.warning(
            "database unreachable while waiting; retrying: %s", redact_url(str(exc.orig))
        )
