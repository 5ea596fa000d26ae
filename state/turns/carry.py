"""When a phase message carries the snapshot its phase continues from, and when a phase
may run from the one it was given (see ``state.turns.engine``).

Only quick phases: their handlers act on nothing outside their result, so running one
on a snapshot that its commit then refuses (forged, or stale) has no effect. Only a
store that binds a carried snapshot to the row in the commit (Postgres), only a first
delivery (a retried or redelivered one asks the database what landed), and only a
snapshot small enough to travel in a message.
"""

from __future__ import annotations

from state.agent_set import AgentSet
from state.sessions.snapshot import CARRY_MAX_CHARS, Snapshot, carried_snapshot
from state.turns.draft import Delivery
from state.turns.services import TurnServices


def may_carry(services: TurnServices, agent: AgentSet, phase: str) -> bool:
    """Whether messages of ``phase`` may carry a snapshot, and the phase run from it."""
    return (
        services.settings.carry_snapshot
        and services.sessions.verifies_carried
        and agent.is_quick(phase)
    )


def carries(services: TurnServices, agent: AgentSet, phase: str, payload: str) -> bool:
    """Whether the message of ``phase`` carries the snapshot whose cache form is
    ``payload`` (a bigger one is not carried: its phase reads the cache)."""
    return may_carry(services, agent, phase) and len(payload) <= CARRY_MAX_CHARS


def carried(services: TurnServices, agent: AgentSet, delivery: Delivery) -> Snapshot | None:
    """The snapshot ``delivery`` carries, if its phase may run from it (not yet checked
    against the row: its commit does that)."""
    if delivery.carried is None or delivery.revision is None or not delivery.use_cache:
        return None
    if not may_carry(services, agent, delivery.phase):
        return None
    return carried_snapshot(delivery.session_id, delivery.revision, delivery.carried)
