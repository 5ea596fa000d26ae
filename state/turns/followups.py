"""What a phase's commits set in motion: gathered after each commit, sent once the last
one is durable (the next phase, workflow steps, wake-ups, the deadline's alarm)."""

from __future__ import annotations

from dataclasses import dataclass, field

from state.agent_set import AgentSet
from state.documents.codec import Document
from state.events.log import WORKFLOW_FINISHED
from state.machine import Phase
from state.sessions.snapshot import Snapshot
from state.storage import keys
from state.turns import carry
from state.turns.deadlines import ring_at
from state.turns.draft import Draft
from state.turns.services import TurnServices


@dataclass
class Followups:
    """Messages to enqueue once the commit is durable."""

    phase: tuple[str, int] | None = None
    deadline: float | None = None
    steps: list[tuple[str, str, int]] = field(default_factory=list)
    user_cache: list[tuple[str, int, Document]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)  # workflows the commits cancelled
    streamed: list[str] = field(default_factory=list)  # answered messages whose chunks go


def collect(draft: Draft, followups: Followups) -> None:
    """Add what the committed ``draft`` set in motion."""
    followups.steps.extend(draft.roots)
    followups.finished.extend(
        str(e.data["workflow_id"]) for e in draft.events if e.kind == WORKFLOW_FINISHED
    )
    followups.user_cache.extend(draft.user_writes)
    if draft.turn_over and draft.streamed is not None:
        followups.streamed.append(draft.streamed)
    if draft.phase == Phase.EXECUTING and draft.roots:
        # Waiting on a workflow: an in-process alarm rings the deadline check.
        followups.deadline = draft.deadline


def cache_user_states(services: TurnServices, followups: Followups) -> None:
    """Write the user states the commits changed to the cache."""
    for user_id, revision, doc in followups.user_cache:
        services.cache.put(keys.user_state_cache(user_id), revision, doc)


def send_carrying(
    services: TurnServices, agent: AgentSet, snap: Snapshot, followups: Followups, payload: str
) -> None:
    """Send the next phase now if its message carries the snapshot (``payload``): that
    phase reads neither the cache nor the lock, so the cache write and the release need
    not delay it (an older cache write never replaces a newer one)."""
    if followups.phase is None:
        return
    phase, revision = followups.phase
    if carry.carries(services, agent, phase, payload):
        services.dispatcher.phase(phase, snap.session_id, revision, payload)
        followups.phase = None


def send(services: TurnServices, snap: Snapshot, followups: Followups) -> None:
    """Send the rest, after the cache write: these readers may read the cache."""
    session_id, dispatcher = snap.session_id, services.dispatcher
    for workflow_id, step_id, revision in followups.steps:
        dispatcher.step(workflow_id, step_id, revision)
    for workflow_id in followups.finished:
        services.notifier.workflow(workflow_id)
    if followups.deadline is not None:
        ring_at(session_id, followups.deadline, dispatcher)
    if followups.phase is not None:  # a phase not carrying the snapshot
        phase, revision = followups.phase
        dispatcher.phase(phase, session_id, revision, None)
    for message_id in followups.streamed:  # last: nothing waits for it
        services.tokens.end(session_id, message_id)
