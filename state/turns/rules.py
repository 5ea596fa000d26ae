"""The turn rules: how a turn starts, how a handler's result changes the draft, how a
turn fails and recovers. Pure changes to a :class:`Draft`; the writes they need inside
the commit's transaction are queued as ``draft.ops``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy.exc import IntegrityError

from config import Settings
from state.agent import ENGINE_CONTEXT_KEYS, PhaseResult
from state.approvals import rows as approval_rows
from state.approvals.requests import ApprovalRequest
from state.approvals.rows import Decision
from state.clock import utcnow
from state.documents.codec import Document, require_object
from state.errors import (
    ApprovalAlreadyDecidedError,
    InvalidTransitionError,
    ReservedContextKeyError,
    UnstorableResultError,
    UserStateTooLargeError,
)
from state.events import log
from state.machine import Phase, Trigger
from state.session import make_message
from state.sessions.snapshot import InboxItem, InboxState, NewEvent
from state.storage import user_rows
from state.turns.draft import Draft
from state.workflows.control import cancel_in, lock_workflow
from state.workflows.creation import insert_workflow
from state.workflows.spec import SpecLimits, parse_spec

MAX_EXECUTION_ATTEMPTS = 3
ERROR_REPLY = "Sorry, something went wrong while I worked on that. Please try again."
TIMEOUT_REPLY = "Sorry, that took too long and I had to stop. Please try again."
DEFAULT_REPLY = "(the agent gave no reply)"
CLARIFY_REPLY = "Could you tell me a little more?"
CANCELLED_REPLY = "Cancelled: I stopped working on that."
DEADLINE_PASSED = "execution deadline passed"  # the recorded cause of a timed-out turn
_TURN_LISTS = ("tool_results", "pending_actions", "active_tools")
# Where the turn keeps the approval it waits for, and then the decision (context_window).
APPROVAL_ID_KEY = "approval_id"
APPROVAL_KEY = "approval"
# A turn's own executing deadline, in seconds (context_window; see ``_turn_timeout``).
TURN_TIMEOUT_KEY = "turn_timeout_s"
CANCELLED_BY = "cancelled"
_WORKFLOWS_KEPT = 20


def start_turn(draft: Draft, item: InboxItem) -> None:
    """Begin the turn of ``item``: its user message joins the history."""
    trigger = Trigger.RECEIVE_INPUT if draft.phase == Phase.IDLE else Trigger.USER_RESPONDED
    draft.metadata["turn"] = {
        "message_id": item.message_id,
        "started_at": utcnow().isoformat(),
        "path": [draft.phase],
    }
    draft.fire(trigger)
    draft.context = {"message": item.text, "message_id": item.message_id, "attempt": 1}
    for key in _TURN_LISTS:
        draft.doc[key] = []
    draft.messages.append(make_message("user", item.text, {"message_id": item.message_id}))
    draft.inbox[item.message_id] = InboxState.STARTED
    draft.events.append(NewEvent(log.TURN_STARTED, {"message_id": item.message_id}))


def apply_result(
    phase: Phase,
    draft: Draft,
    result: PhaseResult,
    *,
    settings: Settings,
    known_actions: Callable[[], Iterable[str]],
) -> None:
    """Fold a handler's result into the draft and fire its trigger (``settings`` gives
    the execution timeout and the limits on what a result may store)."""
    _merge_context(draft, result.context)
    draft.metadata.update(result.metadata)
    for key in _TURN_LISTS:
        value = getattr(result, key)
        if value is not None:
            draft.doc[key] = value
    if result.user_state is not None:
        _change_user_state(draft, result.user_state, settings.max_user_state_bytes)
    if result.approval is not None:
        _ask_for_approval(draft, result, settings)
        return
    if result.trigger is None:
        limits = SpecLimits.from_settings(settings)
        ttl_s = settings.approval_ttl
        _wait_for_workflow(
            phase, draft, result.workflow, known_actions, limits=limits, approval_ttl_s=ttl_s
        )
        return
    if result.trigger == Trigger.RETRY_NEEDED:
        _count_attempt(draft)
    draft.fire(result.trigger)
    _on_enter(draft, result.reply, settings.execution_timeout)


def _merge_context(draft: Draft, context: Document) -> None:
    """Merge a result's context into the turn's; the engine's own keys may come back
    unchanged (a handler passing ``ctx.context`` on) but not changed."""
    ours = ENGINE_CONTEXT_KEYS.intersection(context)
    for key in sorted(ours):
        if context[key] != draft.context.get(key):
            raise ReservedContextKeyError(
                f"the result's context sets {key!r}, a key the engine owns "
                f"({', '.join(sorted(ENGINE_CONTEXT_KEYS))}); read it from the PhaseContext "
                "and keep your own values under other names"
            )
    # A decision is shown to the one phase that follows it, so its action runs once.
    draft.context.pop(APPROVAL_KEY, None)
    draft.context.update({k: v for k, v in context.items() if k not in ours})


def _on_enter(draft: Draft, reply: str | None, execution_timeout_s: float) -> None:
    if draft.phase == Phase.EXECUTING:
        draft.deadline = time.time() + _turn_timeout(draft, execution_timeout_s)
    elif draft.snap.phase == Phase.EXECUTING:
        draft.deadline = None
    if draft.phase == Phase.CLARIFYING:
        draft.reply(reply or CLARIFY_REPLY, kind="clarification")
    elif draft.phase == Phase.IDLE:
        draft.reply(reply or DEFAULT_REPLY)
    elif draft.phase in (Phase.ERROR, Phase.TIMEOUT):
        recover(draft, reply)


def _turn_timeout(draft: Draft, default_s: float) -> float:
    """The executing deadline's length: AGENTSTATE_EXECUTION_TIMEOUT, unless the turn's
    agent set :data:`TURN_TIMEOUT_KEY` in its context (a framework agent, whose whole run
    is its executing phase, sets AGENTSTATE_FRAMEWORK_TURN_TIMEOUT there)."""
    value = draft.context.get(TURN_TIMEOUT_KEY)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default_s


def _count_attempt(draft: Draft) -> None:
    attempt = int(draft.context.get("attempt", 1)) + 1
    if attempt > MAX_EXECUTION_ATTEMPTS:
        raise InvalidTransitionError(f"gave up after {MAX_EXECUTION_ATTEMPTS} attempts")
    draft.context["attempt"] = attempt


def _wait_for_workflow(
    phase: Phase,
    draft: Draft,
    spec: Document | None,
    known_actions: Callable[[], Iterable[str]],
    *,
    limits: SpecLimits,
    approval_ttl_s: float,
) -> None:
    if phase != Phase.EXECUTING or spec is None:
        raise InvalidTransitionError(
            f"{phase} returned no trigger; only executing may wait, and only for a workflow"
        )
    wf = parse_spec({**spec, "session_id": draft.snap.session_id}, known_actions(), limits=limits)
    resume_revision = draft.snap.revision + 1

    def create(conn: Any) -> None:
        user_id = draft.snap.user_id
        try:
            roots, asked = insert_workflow(
                conn, wf, resume_revision, approval_ttl_s=approval_ttl_s, user_id=user_id
            )
        except IntegrityError as exc:
            raise UnstorableResultError(f"workflow {wf.workflow_id!r} already exists") from exc
        draft.roots.extend((wf.workflow_id, step_id, rev) for step_id, rev in roots)
        draft.events.extend(asked)

    draft.ops.append(create)
    draft.events.append(NewEvent(log.WORKFLOW_STARTED, {"workflow_id": wf.workflow_id}))
    draft.label = "wait_for_workflow"
    draft.context["workflow_id"] = wf.workflow_id
    kept = [*draft.metadata.get("workflows", []), wf.workflow_id][-_WORKFLOWS_KEPT:]
    draft.metadata["workflows"] = kept


def _ask_for_approval(draft: Draft, result: PhaseResult, settings: Settings) -> None:
    if result.trigger not in (None, Trigger.NEED_APPROVAL):
        raise InvalidTransitionError(
            f"a result that asks for approval fires no other trigger (got {result.trigger!r})"
        )
    request = ApprovalRequest.parse(
        result.approval,
        default_ttl_s=settings.approval_ttl,
        max_args_bytes=settings.max_step_io_bytes,
    )
    draft.fire(Trigger.NEED_APPROVAL)
    _on_enter(draft, None, settings.execution_timeout)
    approval_id = approval_rows.new_id()
    draft.context[APPROVAL_ID_KEY] = approval_id
    subject = approval_rows.Subject(draft.snap.session_id, draft.snap.user_id)

    def ask(conn: Any) -> None:
        draft.events.append(
            approval_rows.insert_request(
                conn, subject, request.action, request.args, request.ttl_s, approval_id=approval_id
            )
        )

    draft.ops.append(ask)


def decide_approval(
    draft: Draft,
    approval: Document,
    decision: Decision,
    settings: Settings,
    user_id: str | None = None,
) -> None:
    """Resume the turn that waits for ``approval`` with ``decision``: approved, it goes on
    to executing; rejected, straight to generating. The next phase's handler sees the
    decision as ``ctx.approval``. Raises ApprovalAlreadyDecidedError from the commit if
    another decision got there first."""
    draft.fire(Trigger.APPROVED if decision.approve else Trigger.REJECTED)
    _on_enter(draft, None, settings.execution_timeout)
    approval_id = str(approval["approval_id"])
    draft.context.pop(APPROVAL_ID_KEY, None)
    draft.context[APPROVAL_KEY] = {
        "approval_id": approval_id,
        "action": approval["action"],
        "args": approval["args"],
        "decision": decision.verdict.value,
        "approved": decision.approve,
        "by": decision.by,
        "note": decision.note,
    }

    def record(conn: Any) -> None:
        decided = approval_rows.decide(conn, approval_id, decision, user_id)
        if decided is None:
            raise ApprovalAlreadyDecidedError(f"approval {approval_id} was decided already")
        draft.events.append(approval_rows.decided_event(decided))

    draft.ops.append(record)


def _close_approval(draft: Draft, by: str) -> None:
    """The turn ends while it waits for a decision: nobody should be asked any more."""
    if draft.snap.phase != Phase.AWAITING_APPROVAL:
        return
    session_id = draft.snap.session_id
    draft.ops.append(lambda conn: approval_rows.close_for_session(conn, session_id, by))


def _change_user_state(
    draft: Draft, change: Callable[[Document], Document], max_bytes: int
) -> None:
    user_id = draft.snap.user_id

    def checked_change(state: Document) -> Document:
        # The handler's function runs inside the commit: whatever it raises means its
        # result cannot be stored, not that the engine is broken.
        try:
            return require_object(change(state), "user state")
        except Exception as exc:
            raise UnstorableResultError(f"the user-state change raised {exc!r}") from exc

    def write(conn: Any) -> None:
        try:
            doc, revision = user_rows.mutate(conn, user_id, checked_change, max_bytes=max_bytes)
        except UserStateTooLargeError as exc:
            raise UnstorableResultError(str(exc)) from exc
        draft.user_writes.append((user_id, revision, doc))

    draft.ops.append(write)


def fail_turn(draft: Draft, trigger: Trigger | None, reply: str, cause: str) -> None:
    """Drop the handler's changes and end the turn with ``reply`` (an apology); a
    workflow the turn waits on is cancelled with it."""
    draft.rollback()
    cancel_waited_workflow(draft)
    _close_approval(draft, by="turn ended")
    failed_in = draft.phase  # after the rollback: the phase whose work failed
    if trigger is not None:
        draft.fire(trigger)
    error = {
        "cause": "timeout" if trigger == Trigger.TIMEOUT else "error",
        "detail": cause[:500],
        "phase": failed_in,
    }
    draft.metadata["last_error"] = {**error, "at": utcnow().isoformat()}
    draft.events.append(NewEvent(log.TURN_FAILED, error))
    recover(draft, reply)


def cancel_turn(draft: Draft) -> None:
    """End the turn now, at the caller's request: the session rests again, the turn's
    message is answered once with a ``cancelled`` reply, its workflow is cancelled.

    The FSM has no cancel trigger; the turn leaves through ``error_occurred`` and
    ``reset``, and its metadata says it was cancelled.
    """
    draft.rollback()
    cancel_waited_workflow(draft)
    _close_approval(draft, by=CANCELLED_BY)
    draft.fire(Trigger.ERROR_OCCURRED)
    draft.metadata["turn"] = {**draft.metadata.get("turn", {}), "cancelled": True}
    draft.fire(Trigger.RESET)
    draft.deadline = None
    message_id = draft.context.get("message_id")
    draft.events.append(NewEvent(log.TURN_CANCELLED, {"message_id": message_id}))
    draft.reply(CANCELLED_REPLY, kind="cancelled")


def roll_back_turn(draft: Draft, before: Document | None, phase: str) -> None:
    """Remove the running turn as if its message had never been sent: the session's
    document goes back to ``before`` (as it was when the turn started; None if that is
    no longer kept: the turn's own keys are cleared) in ``phase``, the history rows the
    turn added go (an op of the caller's), the message is marked rolled back. Its
    workflow is cancelled and its approval request closed, as for a cancel."""
    message_id = draft.context.get("message_id")
    draft.rollback()
    cancel_waited_workflow(draft)
    _close_approval(draft, by=CANCELLED_BY)
    if before is not None:
        draft.doc = dict(before)
        draft.context = dict(before.get("context_window") or {})
        draft.metadata = dict(before.get("metadata") or {})
    else:
        draft.context = {}
        for key in _TURN_LISTS:
            draft.doc[key] = []
    draft.machine.state = phase
    draft.deadline = None
    if message_id:
        draft.inbox[str(message_id)] = InboxState.ROLLED_BACK
    draft.events.append(
        NewEvent(log.TURN_CANCELLED, {"message_id": message_id, "rolled_back": True})
    )


def supersede_waiting(draft: Draft, waiting: list[InboxItem], *, roll_back: bool) -> None:
    """End the turns of messages still waiting in the inbox before they start: each is
    taken and cancelled at once (answered with the cancelled reply), or rolled back
    (never in the history)."""
    for item in waiting:
        draft.events.append(NewEvent(log.TURN_STARTED, {"message_id": item.message_id}))
        data: Document = {"message_id": item.message_id}
        if roll_back:
            draft.inbox[item.message_id] = InboxState.ROLLED_BACK
            draft.events.append(NewEvent(log.TURN_CANCELLED, {**data, "rolled_back": True}))
            continue
        reply = make_message(
            "assistant", CANCELLED_REPLY, {"reply_to": item.message_id, "kind": "cancelled"}
        )
        draft.messages += [make_message("user", item.text, data), reply]
        draft.inbox[item.message_id] = InboxState.ANSWERED
        draft.events += [NewEvent(log.TURN_CANCELLED, data), log.reply_event(reply)]


def cancel_waited_workflow(draft: Draft) -> None:
    """Cancel, in the same commit, the workflow the turn waits on (if still running)."""
    workflow_id = draft.context.get("workflow_id")
    if not workflow_id or draft.snap.phase != Phase.EXECUTING:
        return

    def lock(conn: Any) -> None:
        # The workflow's row before the session's: the order a finishing workflow takes
        # them in (it appends its event to the session), so the two never deadlock.
        lock_workflow(conn, str(workflow_id))

    def cancel(conn: Any) -> None:
        finished = cancel_in(conn, str(workflow_id))
        if finished is not None:
            data = {"workflow_id": finished.workflow_id, "status": finished.status}
            draft.events.append(NewEvent(log.WORKFLOW_FINISHED, data))

    draft.prepare.append(lock)
    draft.ops.append(cancel)


def recover(draft: Draft, reply: str | None) -> None:
    """Reset from error or timeout to idle, answering the turn's message."""
    draft.fire(Trigger.RESET)
    draft.deadline = None
    draft.reply(reply or ERROR_REPLY, kind="apology")
