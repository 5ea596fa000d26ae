"""Calling a step's action: its inputs, its dependencies' outputs and its context in;
its outputs checked storable and within AGENTSTATE_MAX_STEP_IO_BYTES out. A claimed step's
call keeps its lease alive (and its ``timeout_s`` watched) while the action runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from state.documents import codec
from state.documents.codec import Document
from state.errors import InvalidPayloadError, StepOutputTooLargeError
from state.ids import step_key
from state.ticker import Ticker
from state.workflows.records import ClaimedStep
from state.workflows.store import WorkflowStore

logger = logging.getLogger("state.workflows.engine")

ActionFn = Callable[[Document, Document, Document], Document]

_heartbeats = Ticker("step-heartbeat")


class StepFailed(str):
    """``"failed"``, as :meth:`WorkflowEngine.run_step` returns it for a step that ended
    failed, with the error that failed it (the task reports it, e.g. to Flower)."""

    error: str

    def __new__(cls, error: str) -> StepFailed:
        status = super().__new__(cls, "failed")
        status.error = error
        return status


def call_leased(
    fn: ActionFn,
    claimed: ClaimedStep,
    store: WorkflowStore,
    lease_s: float,
    *,
    max_bytes: int,
    overran: Callable[[ClaimedStep], bool],
) -> Document:
    """Call a claimed step's action, heartbeating its claim every third of the lease and
    calling ``overran`` once if it runs past the step's ``timeout_s``."""
    key = f"{claimed.workflow_id}/{claimed.step_id}@{claimed.revision}"
    _heartbeats.register(key, lease_s / 3, lambda: store.heartbeat(claimed, lease_s))
    if claimed.timeout_s is not None:
        _heartbeats.register(f"{key}:timeout", claimed.timeout_s, partial(overran, claimed))
    try:
        return outputs(fn, claimed, store, max_bytes)
    finally:
        _heartbeats.unregister(key)
        _heartbeats.unregister(f"{key}:timeout")


def outputs(fn: ActionFn, claimed: ClaimedStep, store: WorkflowStore, max_bytes: int) -> Document:
    """Call the action; its outputs, checked storable and within the size limit."""
    deps = claimed.dep_outputs
    if deps is None:
        deps = store.dependency_outputs(claimed.workflow_id, claimed.dependencies)
    key = step_key(claimed.workflow_id, claimed.step_id)
    context = {**store.context(claimed.workflow_id, claimed.generation), "idempotency_key": key}
    result = fn(dict(claimed.inputs), deps, context)
    if not isinstance(result, dict):
        raise InvalidPayloadError(
            f"action {claimed.action!r} returned {type(result).__name__}, not a JSON object"
        )
    # Unstorable outputs fail the step here, not in the commit.
    what = f"the outputs of action {claimed.action!r}"
    size = len(codec.require_storable(result, what).encode())
    if size > max_bytes:
        raise StepOutputTooLargeError(
            codec.too_large(what, size, max_bytes, "AGENTSTATE_MAX_STEP_IO_BYTES")
        )
    return result


def log_raised(workflow_id: str, step_id: str, exc: BaseException) -> None:
    # With its traceback, at WARNING: an action's bug shows at a worker's default level
    # (under the engine's logger name, which operators filter on).
    logger.warning("step %s/%s raised %r", workflow_id, step_id, exc, exc_info=exc)
