"""Running workflows: start, run one step, retry with backoff, propagate failure."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import replace

from config import Settings
from state.dispatch import Dispatcher
from state.documents import codec
from state.documents.codec import Document
from state.errors import (
    InvalidPayloadError,
    StaleStateError,
    StepOutputTooLargeError,
    WorkflowSpecError,
)
from state.machine import Phase
from state.ticker import Ticker
from state.workflow import SpecLimits, WorkflowState, parse_spec
from state.workflows.records import ClaimedStep, Completion, Leftover
from state.workflows.store import WorkflowStore

logger = logging.getLogger(__name__)

ActionFn = Callable[[Document, Document, Document], Document]
ActionLookup = Callable[[str], ActionFn | None]
MAX_BACKOFF_S = 300.0

_heartbeats = Ticker("step-heartbeat")


def retry_delay_s(base_s: float, retries_done: int) -> float:
    """Exponential backoff with jitter: about base, 2*base, 4*base, ... (capped)."""
    delay = min(MAX_BACKOFF_S, base_s * 2**retries_done)
    return float(delay * random.uniform(0.5, 1.0))


class WorkflowEngine:
    """Starts workflows and runs their steps exactly once each."""

    def __init__(
        self,
        store: WorkflowStore,
        dispatcher: Dispatcher,
        actions: ActionLookup,
        settings: Settings,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.actions = actions
        self.settings = settings

    def validate(self, spec: object, known_actions: Iterable[str]) -> WorkflowState:
        """The workflow a spec describes, fully checked; nothing is stored."""
        wf = parse_spec(spec, known_actions, limits=SpecLimits.from_settings(self.settings))
        if self.store.exists(wf.workflow_id):
            raise WorkflowSpecError(f"workflow {wf.workflow_id!r} already exists")
        return wf

    def start(self, wf: WorkflowState) -> str:
        """Store a validated workflow and dispatch its roots."""
        for step_id, revision in self.store.create(wf):
            self.dispatcher.step(wf.workflow_id, step_id, revision)
        return wf.workflow_id

    def run_step(
        self, workflow_id: str, step_id: str, revision: int, task_id: str | None = None
    ) -> str:
        """Run one step delivery; return what happened (``duplicate`` if not ours)."""
        lease_s = self.settings.stuck_after
        claimed = self.store.claim(workflow_id, step_id, revision, lease_s, task_id)
        if claimed is None:
            left = self.store.leftover(workflow_id, step_id, task_id) if task_id else None
            if left is None:
                logger.info("step %s/%s@%s: duplicate, dropped", workflow_id, step_id, revision)
                return "duplicate"
            if left.claimed is None:
                self._finish_leftover(workflow_id, step_id, left)
                return "resumed"
            claimed = left.claimed
        claimed = replace(claimed, task_id=task_id)
        fn = self.actions(claimed.action)
        if fn is None:
            error = f"unknown action {claimed.action!r} (is AGENTSTATE_ACTION_MODULES set?)"
            return self._fail(claimed, error, retry=False)
        try:
            outputs = self._call(fn, claimed, lease_s)
        except StaleStateError:
            raise
        except StepOutputTooLargeError as exc:
            # Running the same action again would only produce the same outputs.
            return self._fail(claimed, str(exc), retry=False)
        except Exception as exc:
            logger.info("step %s/%s raised %r", workflow_id, step_id, exc)
            return self._fail(claimed, f"{type(exc).__name__}: {exc}", retry=True)
        self.follow(self.store.succeed(claimed, outputs))
        return "success"

    def _finish_leftover(self, workflow_id: str, step_id: str, left: Leftover) -> None:
        if left.retry_revision is not None:
            self.dispatcher.step(workflow_id, step_id, left.retry_revision)
        elif left.completion is not None:
            self.follow(left.completion)

    def _call(self, fn: ActionFn, claimed: ClaimedStep, lease_s: float) -> Document:
        deps = claimed.dep_outputs
        if deps is None:
            deps = self.store.dependency_outputs(claimed.workflow_id, claimed.dependencies)
        context = self.store.context(claimed.workflow_id)
        key = f"{claimed.workflow_id}/{claimed.step_id}@{claimed.revision}"
        _heartbeats.register(key, lease_s / 3, lambda: self.store.heartbeat(claimed, lease_s))
        try:
            outputs = fn(dict(claimed.inputs), deps, context)
        finally:
            _heartbeats.unregister(key)
        if not isinstance(outputs, dict):
            raise InvalidPayloadError(
                f"action {claimed.action!r} returned {type(outputs).__name__}, not a JSON object"
            )
        # Unstorable outputs fail the step here, not in the commit.
        what = f"the outputs of action {claimed.action!r}"
        size = len(codec.require_storable(outputs, what).encode())
        limit = self.settings.max_step_io_bytes
        if size > limit:
            raise StepOutputTooLargeError(
                codec.too_large(what, size, limit, "AGENTSTATE_MAX_STEP_IO_BYTES")
            )
        return outputs

    def _fail(self, claimed: ClaimedStep, error: str, *, retry: bool) -> str:
        if retry and claimed.retry_count < claimed.max_retries:
            revision = self.store.retry(claimed, error)
            delay = retry_delay_s(self.settings.retry_backoff, claimed.retry_count)
            self.dispatcher.step(claimed.workflow_id, claimed.step_id, revision, delay)
            return "retrying"
        self.follow(self.store.fail(claimed, error))
        return "failed"

    def follow(self, completion: Completion) -> None:
        """Dispatch what a completion made ready, and wake a waiting session."""
        for step_id, revision in completion.ready:
            self.dispatcher.step(completion.workflow_id, step_id, revision)
        finished = completion.finished
        if finished and finished.session_id and finished.resume_revision is not None:
            self.dispatcher.phase(Phase.EXECUTING, finished.session_id, finished.resume_revision)
