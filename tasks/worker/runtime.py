"""The engines of one process, built on first use from Settings."""

from __future__ import annotations

import os
from dataclasses import dataclass

from config import get_settings
from config.brokers import broker_for
from state.approvals.desk import ApprovalDesk
from state.recovery.sweep import RecoverySweep
from state.schedules.ticks import ScheduleClock, TickRules
from state.storage.backend import Backend, default_backend, reset_backends
from state.turns.engine import TurnEngine
from state.turns.services import TurnServices
from state.webhooks.courier import Courier
from state.workflows.engine import WorkflowEngine
from state.workflows.store import WorkflowStore
from tasks.actions import get_action, known_actions
from tasks.agents.registry import agent_set
from tasks.app import app
from tasks.dispatch.dispatcher import CeleryDispatcher


@dataclass(frozen=True)
class Runtime:
    """Everything a worker process uses to run agentstate tasks."""

    backend: Backend
    services: TurnServices
    turns: TurnEngine
    workflows: WorkflowEngine
    recovery: RecoverySweep
    approvals: ApprovalDesk
    dispatcher: CeleryDispatcher
    clock: ScheduleClock
    courier: Courier


_runtimes: dict[int, Runtime] = {}


def runtime() -> Runtime:
    """This process's runtime (built once per process, never shared across a fork)."""
    built = _runtimes.get(os.getpid())
    if built is None:
        _runtimes.clear()
        built = _runtimes[os.getpid()] = build_runtime(default_backend(get_settings()))
    return built


def build_runtime(backend: Backend) -> Runtime:
    """Wire the stores and engines together for ``backend``."""
    dispatcher = CeleryDispatcher(app, broker_for(backend.settings))
    services = TurnServices.build(backend, dispatcher, known_actions)
    turns = TurnEngine(services, agent_set(backend.settings))
    workflows = WorkflowEngine(
        WorkflowStore.for_engine(backend.engine, backend.statements),
        dispatcher,
        get_action,
        backend.settings,
        services.notifier,
    )
    recovery = RecoverySweep(services, turns.interventions, workflows)
    approvals = ApprovalDesk(backend.engine, turns.interventions, workflows)
    clock = ScheduleClock(backend.engine, TickRules.from_settings(backend.settings))
    courier = Courier.build(backend.engine, backend.settings)
    return Runtime(
        backend, services, turns, workflows, recovery, approvals, dispatcher, clock, courier
    )


def reset_runtime() -> None:
    """Forget the runtime (after a fork, or when tests change settings)."""
    _runtimes.clear()
    reset_backends()
