"""Running workflows: start, run one step, retry with backoff, propagate failure."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from sqlalchemy.exc import IntegrityError

from config import HopPolicy, Settings
from state.agent import is_quick
from state.dispatch import Dispatcher
from state.documents.codec import Document
from state.errors import (
    StaleStateError,
    WorkflowIdConflictError,
)
from state.events.push import Notifier
from state.machine import Phase
from state.workflow import WorkflowState
from state.workflows import calls, fairshare
from state.workflows.calls import ActionFn, StepFailed
from state.workflows.fleet import Fleet
from state.workflows.records import ClaimedStep, Completion, Dispatch, Leftover, carried_step
from state.workflows.retries import retry_delay_s, retryable
from state.workflows.spec import SpecLimits, parse_spec
from state.workflows.store import WorkflowStore

logger = logging.getLogger(__name__)

ActionLookup = Callable[[str], ActionFn | None]
# How far one delivery may go on into released quick steps (the inline policy): steps
# after its own, and seconds.
CONTINUE_STEPS = 64
CONTINUE_FOR_S = 0.5


class WorkflowEngine:
    """Starts workflows and runs their steps exactly once each."""

    def __init__(
        self,
        store: WorkflowStore,
        dispatcher: Dispatcher,
        actions: ActionLookup,
        settings: Settings,
        notifier: Notifier | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.actions = actions
        self.settings = settings
        self.notifier = notifier
        hints = notifier.redis if notifier is not None else None
        cap = settings.user_step_concurrency
        fleet = Fleet(hints, settings.queue, settings.children_for_turns)
        self.share = fairshare.FairShare(store.engine, dispatcher, cap, hints, fleet)

    def validate(self, spec: object, known_actions: Iterable[str]) -> WorkflowState:
        """The workflow a spec describes, fully checked; nothing is stored."""
        return parse_spec(spec, known_actions, limits=SpecLimits.from_settings(self.settings))

    def start(self, wf: WorkflowState, user_id: str | None = None) -> str:
        """Store a validated workflow and dispatch its roots; its owner is its session's
        user (which must be ``user_id`` if given) or ``user_id``. The workflow id is the
        idempotency key: starting it again with the same spec (as the same user) returns
        the id and runs nothing again; with another spec it is refused."""
        quota = self.settings.max_pending_approvals
        try:
            roots = self.store.create(
                wf, self.settings.approval_ttl, user_id=user_id, max_pending_approvals=quota
            )
        except IntegrityError as exc:
            same = self.store.spec_hash(wf.workflow_id) == wf.spec_hash
            if same and self.store.document_owner_matches(wf.workflow_id, user_id):
                return wf.workflow_id
            raise WorkflowIdConflictError(
                f"workflow {wf.workflow_id!r} already exists with another spec; "
                "use a new workflow_id"
            ) from exc
        self.dispatch_roots(wf, roots)
        return wf.workflow_id

    def dispatch_roots(self, wf: WorkflowState, roots: list[Dispatch]) -> None:
        """Send a stored workflow's root steps (within its owner's fair share): the second
        half of :meth:`start`, for a caller that stored the workflow in a transaction of
        its own (a schedule's tick)."""
        quick = {sid for sid, step in wf.steps.items() if is_quick(self.actions(step.action))}
        for step_id, revision in self.share.window(wf.workflow_id, roots, quick):
            self.dispatcher.step(wf.workflow_id, step_id, revision)

    def cancel(self, workflow_id: str, user_id: str | None = None) -> bool:
        """Cancel a running workflow (one guarded commit); False if not (or not ours)."""
        finished = self.store.cancel_workflow(workflow_id, user_id)
        if finished is None:
            return False
        self.follow(Completion(workflow_id, [], finished))
        return True

    def retry(self, workflow_id: str, user_id: str | None = None) -> bool:
        """Run a failed or cancelled workflow again from where it stopped; False if it
        was neither (or is not ``user_id``'s)."""
        asking = (self.settings.approval_ttl, user_id, self.settings.max_pending_approvals)
        ready = self.store.retry_workflow(workflow_id, *asking)
        if ready is None:
            return False
        self.follow(Completion(workflow_id, ready, None))
        return True

    def run_step(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        task_id: str | None = None,
        *,
        redelivered: bool = False,
        carried: str | None = None,
    ) -> str:
        """Run one step delivery; return what happened (``duplicate`` if not ours).

        ``carried``: the step as a peek would read it (the message's, untrusted), which
        a quick action's first delivery runs from without reading; its commit lands only
        if the row still holds exactly that, else the step is read and run again.

        ``redelivered``: the broker delivers it again because its worker was lost. Such a
        delivery is claimed even for a quick action, so that a step that kills its
        worker gets the claim's lease and the sweep's count of lost workers (given up
        after AGENTSTATE_MAX_RECOVERIES) instead of running again on every redelivery.
        """
        if not redelivered:
            quick = self._run_quick(workflow_id, step_id, revision, task_id, carried)
            if quick is not None:
                return quick
        lease_s = self.settings.stuck_after
        # A workflow of no owner (the operator's) is capped as one more owner, "".
        cap, fleet_cap = self.settings.user_step_concurrency, self.share.fleet_cap()
        owner = self.share.owner(workflow_id) if cap or fleet_cap else ""
        claimed = self.store.claim(
            workflow_id,
            step_id,
            revision,
            lease_s,
            task_id,
            cap=cap,
            owner=owner,
            fleet_cap=fleet_cap,
        )
        capped = bool(cap or fleet_cap)
        if claimed is None:
            if self._wait_for_timer(workflow_id, step_id, revision):
                return "waiting"
            if capped and fairshare.park(self.store.engine, workflow_id, step_id, revision):
                # Over its owner's share or the fleet's: it waits in the database, holding
                # nothing, until a running step finishes (and releases it).
                self.share.release(workflow_id)  # in case the last one finished meanwhile
                return "waiting"
            left = self.store.leftover(workflow_id, step_id, task_id) if task_id else None
            if left is None:
                logger.info("step %s/%s@%s: duplicate, dropped", workflow_id, step_id, revision)
                return "duplicate"
            if left.claimed is None:
                self._finish_leftover(workflow_id, step_id, left)
                return "resumed"
            claimed = left.claimed
        outcome = self._run_claimed(replace(claimed, task_id=task_id), lease_s)
        if capped:  # its slot is free (a lost worker's is freed by the sweep's release)
            self.share.release(workflow_id)
        return outcome

    def _run_quick(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        task_id: str | None,
        carried: str | None = None,
    ) -> str | None:
        """Run a step whose action is quick (``@quick``) without claiming it, then, under
        the inline policy, the quick steps it releases (:meth:`_continue`). None when
        the step is not one of those now: the claim decides."""
        outcome = self._quick_once(workflow_id, step_id, revision, task_id, carried)
        if not isinstance(outcome, Completion):
            return outcome
        self._continue(outcome, task_id)
        return "success"

    def _quick_once(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        task_id: str | None,
        carried: str | None = None,
    ) -> Completion | str | None:
        """A read (none if ``carried`` holds), the action, and the success as the step's
        one commit, guarded by its revision, so of two deliveries running it at once one
        commits and the other finds it moved. The completion, not yet followed; what
        happened if the action failed; None if the step is not quick and ready at
        ``revision``."""
        if carried is not None and self.store.verifies_carried:
            step = carried_step(workflow_id, step_id, revision, carried)
            done = None if step is None else self._run_carried(step, task_id, carried)
            if done is not None:
                return done
        peeked = self.store.peek(workflow_id, step_id, revision)
        fn = None if peeked is None else self.actions(peeked.action)
        if peeked is None or fn is None or not is_quick(fn):
            return None
        peeked = replace(peeked, task_id=task_id)
        try:
            outputs = self._outputs(fn, peeked)
        except Exception as exc:
            # A failed attempt counts under a claim, like any other step's.
            calls.log_raised(workflow_id, step_id, exc)
            lease_s = self.settings.stuck_after
            # Uncapped: the failed attempt must count, whatever the owner's share.
            claimed = self.store.claim(workflow_id, step_id, revision, lease_s, task_id)
            if claimed is None:
                return "duplicate"
            error = f"{type(exc).__name__}: {exc}"
            return self._fail(replace(claimed, task_id=task_id), error, retry=retryable(exc))
        return self.store.succeed_unclaimed(peeked, outputs)

    def _worth_carrying(self, completion: Completion, step_id: str) -> str | None:
        """What the released step's message carries: only for a quick action (others are
        claimed, and read with the claim), and never with AGENTSTATE_CARRY_SNAPSHOT=false
        (messages an older worker's guard accepts)."""
        carried = completion.carried.get(step_id)
        if carried is None or not self.settings.carry_snapshot:
            return None
        fn = self.actions(completion.actions.get(step_id, ""))
        return carried if fn is not None and is_quick(fn) else None

    def _run_carried(
        self, step: ClaimedStep, task_id: str | None, carried: str
    ) -> Completion | None:
        """Run a quick step from what its message carried and commit it bound to the row;
        None if that did not land (stale or forged: nothing was written) or the action
        failed on it (the step's read decides, and its failure counts there)."""
        fn = self.actions(step.action)
        if fn is None or not is_quick(fn):
            return None
        step = replace(step, task_id=task_id)
        try:
            outputs = self._outputs(fn, step)
        except Exception:  # perhaps only on what was carried: the step's read decides
            return None
        try:
            return self.store.succeed_carried(step, carried, outputs)
        except StaleStateError:
            # Forged, stale or already committed: nothing was written. (Any other error
            # goes up as the read's would: a lost reply must reach the task's retry.)
            return None

    def _continue(self, completion: Completion, task_id: str | None) -> None:
        """Follow ``completion``; under the inline policy, run one step it released here
        instead of sending it, the first of them that is quick, and so on down the chain
        (each step still its own commit; the others released are sent, to run in
        parallel).

        A chain ends after CONTINUE_STEPS steps or CONTINUE_FOR_S seconds, so that one
        delivery holds its worker briefly. A chain cut short by a lost worker is picked
        up when the broker delivers the first step again: its leftovers are the ready
        dependents of every step committed under this task id."""
        continue_until = time.monotonic() + CONTINUE_FOR_S
        for _ in range(CONTINUE_STEPS):
            if not self._inline or time.monotonic() > continue_until:
                break
            index = self._next_in_chain(completion)
            if index is None:
                break
            step_id, revision = completion.ready[index]
            others = completion.ready[:index] + completion.ready[index + 1 :]
            self.follow(replace(completion, ready=others))
            carried = completion.carried.get(step_id)
            outcome = self._continue_into(
                completion.workflow_id, step_id, revision, task_id, carried
            )
            if not isinstance(outcome, Completion):
                return
            completion = outcome
        self.follow(completion)

    def _next_in_chain(self, completion: Completion) -> int | None:
        """Which released step to run here: the first whose action is quick, where the
        store said which actions the released steps run; else the first (its read
        decides). None if no step was released or none of them is quick."""
        if not completion.actions:
            return 0 if completion.ready else None
        for index, (step_id, _) in enumerate(completion.ready):
            fn = self.actions(completion.actions.get(step_id, ""))
            if fn is not None and is_quick(fn):
                return index
        return None

    def _continue_into(
        self,
        workflow_id: str,
        step_id: str,
        revision: int,
        task_id: str | None,
        carried: str | None,
    ) -> Completion | str | None:
        """Run a released step here; if it is not quick, or this delivery is stopped
        before its commit (a time limit, a lost connection), send it instead."""
        try:
            outcome = self._quick_once(workflow_id, step_id, revision, task_id, carried)
        except StaleStateError:
            return None  # another delivery of it committed first and follows it up
        except BaseException:
            with contextlib.suppress(Exception):  # best effort: else the sweep sends it
                self.dispatcher.step(workflow_id, step_id, revision)
            raise
        if outcome is None:  # not quick (or not ready after all): the claim decides
            self.dispatcher.step(workflow_id, step_id, revision)
        return outcome

    @property
    def _inline(self) -> bool:
        return self.settings.hop_policy == HopPolicy.INLINE

    def _run_claimed(self, claimed: ClaimedStep, lease_s: float) -> str:
        fn = self.actions(claimed.action)
        if fn is None:
            error = f"unknown action {claimed.action!r} (is AGENTSTATE_ACTION_MODULES set?)"
            return self._fail(claimed, error, retry=False)
        try:
            outputs = self._call(fn, claimed, lease_s)
        except StaleStateError:
            raise
        except Exception as exc:
            calls.log_raised(claimed.workflow_id, claimed.step_id, exc)
            return self._fail(claimed, f"{type(exc).__name__}: {exc}", retry=retryable(exc))
        self.follow(self.store.succeed(claimed, outputs))
        return "success"

    def _wait_for_timer(self, workflow_id: str, step_id: str, revision: int) -> bool:
        # A step with a durable timer: the first delivery starts it and comes back when
        # it runs out, holding no worker meanwhile. The time is in the database, so a
        # lost message only delays the step until the sweep sends it again.
        ready_at = self.store.arm_timer(workflow_id, step_id, revision)
        if ready_at is None or ready_at <= time.time():
            return False
        self.dispatcher.step(workflow_id, step_id, revision, ready_at - time.time())
        return True

    def _finish_leftover(self, workflow_id: str, step_id: str, left: Leftover) -> None:
        if left.retry_revision is not None:
            self.dispatcher.step(workflow_id, step_id, left.retry_revision)
        elif left.completion is not None:
            self.follow(left.completion)

    def _call(self, fn: ActionFn, claimed: ClaimedStep, lease_s: float) -> Document:
        limit = self.settings.max_step_io_bytes
        return calls.call_leased(
            fn, claimed, self.store, lease_s, max_bytes=limit, overran=self._overran
        )

    def _outputs(self, fn: ActionFn, claimed: ClaimedStep) -> Document:
        return calls.outputs(fn, claimed, self.store, self.settings.max_step_io_bytes)

    def _overran(self, claimed: ClaimedStep) -> bool:
        # Runs on the ticker thread while the action is still running: the attempt
        # counts as failed now, and the action's late result will find the revision moved.
        with contextlib.suppress(StaleStateError):  # it finished (or was taken over) in time
            self.time_out(claimed)
        return False  # once

    def expire(self, workflow_id: str, step_id: str, revision: int) -> str:
        """Time out a running step found past its deadline (its worker stuck or gone)."""
        return self.time_out(self.store.claim_at(workflow_id, step_id, revision))

    def time_out(self, claimed: ClaimedStep) -> str:
        """Count a run longer than the step's ``timeout_s`` as a failed attempt."""
        logger.info("step %s/%s ran past its timeout", claimed.workflow_id, claimed.step_id)
        return self._fail(claimed, f"timed out after {claimed.timeout_s:g}s", retry=True)

    def _fail(self, claimed: ClaimedStep, error: str, *, retry: bool) -> str:
        if retry and claimed.retry_count < claimed.max_retries:
            revision = self.store.retry(claimed, error)
            delay = retry_delay_s(self.settings.retry_backoff, claimed.retry_count)
            self.dispatcher.step(claimed.workflow_id, claimed.step_id, revision, delay)
            return "retrying"
        self.follow(self.store.fail(claimed, error))
        return StepFailed(error)

    def follow(self, completion: Completion) -> None:
        """Dispatch what a completion made ready, and wake a waiting session (and those
        waiting for the workflow, or following the session's events)."""
        for step_id, revision in completion.ready:
            carried = self._worth_carrying(completion, step_id)
            self.dispatcher.step(completion.workflow_id, step_id, revision, carried=carried)
        self.share.hand_over(completion.workflow_id)  # its place to a held step, if any
        finished = completion.finished
        if finished and self.notifier is not None:
            self.notifier.workflow(finished.workflow_id)
            if finished.session_id:
                self.notifier.session(finished.session_id)
        if finished and finished.session_id and finished.resume_revision is not None:
            self.dispatcher.phase(Phase.EXECUTING, finished.session_id, finished.resume_revision)
