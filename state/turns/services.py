"""The stores and services a turn uses, built once per process and passed to the turn
engine, its interventions and the recovery sweep."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from config import HopPolicy, Settings
from state.dispatch import Dispatcher
from state.events.push import Notifier
from state.events.stream import TokenStream
from state.lock import DistributedStateSync
from state.machine import RESTING_PHASES, WORK_PHASES, Phase
from state.sessions.inbox import Inbox
from state.sessions.snapshot import Snapshot
from state.sessions.store import SessionStore
from state.storage.backend import Backend
from state.storage.cache import StateCache
from state.store import PersistentStateManager
from state.workflow import WorkflowStatus
from state.workflows.store import WorkflowStore


@dataclass(frozen=True)
class TurnServices:
    """Everything a phase touches besides the agent."""

    settings: Settings
    sessions: SessionStore
    inbox: Inbox
    sync: DistributedStateSync
    users: PersistentStateManager
    workflows: WorkflowStore
    cache: StateCache
    dispatcher: Dispatcher
    known_actions: Callable[[], Iterable[str]]
    notifier: Notifier
    tokens: TokenStream

    @classmethod
    def build(
        cls,
        backend: Backend,
        dispatcher: Dispatcher,
        known_actions: Callable[[], Iterable[str]],
    ) -> TurnServices:
        """Wire the stores of ``backend`` together."""
        sessions = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
        settings = backend.settings
        return cls(
            settings=settings,
            sessions=sessions,
            inbox=Inbox.for_engine(backend.engine, backend.statements),
            sync=DistributedStateSync(backend.redis, sessions, settings=settings),
            users=PersistentStateManager(backend.redis, backend.engine, settings=settings),
            workflows=WorkflowStore.for_engine(backend.engine, backend.statements),
            cache=backend.cache,
            dispatcher=dispatcher,
            known_actions=known_actions,
            notifier=Notifier(backend.redis, settings.events),
            tokens=TokenStream(backend.redis, settings),
        )

    @property
    def inline(self) -> bool:
        """Whether quick phases continue in the same worker (AGENTSTATE_HOP_POLICY)."""
        return self.settings.hop_policy == HopPolicy.INLINE

    def deadline_grace(self, snap: Snapshot) -> float:
        """Seconds past its execution deadline a turn may run: for a turn that waits on (or
        waited on) a workflow, the time the sweep needs to recover a step whose worker was
        lost (STUCK_AFTER and two sweeps) and a fresh EXECUTION_TIMEOUT for that step's new
        run, so that losing a worker costs time, not the answer; else none."""
        if not (snap.doc.get("context_window") or {}).get("workflow_id"):
            return 0.0
        settings = self.settings
        recovery = settings.stuck_after + 2 * settings.sweep_interval
        return recovery + settings.execution_timeout

    def waiting_on_workflow(self, snap: Snapshot) -> bool:
        """Whether the session's turn waits for a workflow that is still running."""
        workflow_id = (snap.doc.get("context_window") or {}).get("workflow_id")
        if not workflow_id:
            return False
        status = self.workflows.status(workflow_id)
        return status is not None and status not in WorkflowStatus.finished()

    def next_phase(self, snap: Snapshot, queued: bool) -> Phase | None:
        """The phase to run after ``snap`` was committed (None: nothing to run now)."""
        if snap.phase in RESTING_PHASES:
            return Phase.UNDERSTANDING if queued else None
        if snap.phase == Phase.EXECUTING and self.waiting_on_workflow(snap):
            return None
        return Phase(snap.phase) if snap.phase in WORK_PHASES else None
