"""What a handler may ask for approval, in-process (real Redis and database): a request
the table does not allow, or one that is malformed, ends the turn with an apology and
stores nothing; the decision is shown to the one phase after it; a waiting session is
not "stuck" for the recovery sweep."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import func, select

from config import Settings
from state.agent import Agent, PhaseContext, PhaseResult
from state.approvals.desk import ApprovalDesk
from state.approvals.requests import ApprovalRequest
from state.approvals.rows import Decision
from state.clock import utcnow
from state.dispatch import RecordingDispatcher
from state.errors import ApprovalAlreadyDecidedError, InvalidPayloadError
from state.recovery.queries import stuck_sessions
from state.storage.backend import Backend
from state.storage.db import read_connection
from state.storage.tables import approvals
from state.turns.engine import TurnEngine
from state.turns.services import TurnServices
from state.workflows.engine import WorkflowEngine
from tasks.actions import get_action, known_actions
from tests.integration.test_turn_engine import drain, send
from tests.support import uid


def engine_with(settings: Settings, **handlers: Any) -> tuple[TurnEngine, RecordingDispatcher]:
    dispatcher = RecordingDispatcher()
    services = TurnServices.build(Backend.build(settings), dispatcher, known_actions)
    return TurnEngine(services, Agent(SimpleNamespace(**handlers), "asks")), dispatcher


def desk_for(engine: TurnEngine) -> ApprovalDesk:
    services = engine.services
    workflows = WorkflowEngine(
        services.workflows, services.dispatcher, get_action, services.settings
    )
    return ApprovalDesk(services.sessions.engine, engine.interventions, workflows)


def approval_rows(engine: TurnEngine, session_id: str) -> int:
    with read_connection(engine.services.sessions.engine) as conn:
        query = select(func.count()).where(approvals.c.session_id == session_id)
        return int(conn.execute(query).scalar_one())


def asking(request: Any) -> Any:
    def handler(ctx: PhaseContext) -> PhaseResult:
        return PhaseResult(approval=request)

    return handler


@pytest.mark.parametrize(
    "request_",
    [
        {"action": "", "args": {}},
        {"action": "pay", "args": []},
        {"action": "pay", "args": {}, "ttl_s": -1},
        {"action": "pay", "args": {}, "ttl_s": float("inf")},
        {"action": "pay", "args": {}, "when": "now"},
        "pay",
    ],
)
def test_a_malformed_request_ends_the_turn_and_stores_nothing(
    settings: Settings, request_: Any
) -> None:
    engine, dispatcher = engine_with(settings, planning=asking(request_))
    session_id = uid("s")
    send(engine, dispatcher, session_id, "hello")
    drain(engine, dispatcher)
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    assert doc["message_history"][-1]["metadata"]["kind"] == "apology"
    assert approval_rows(engine, session_id) == 0


def test_asking_from_a_phase_the_table_does_not_allow_ends_the_turn(settings: Settings) -> None:
    engine, dispatcher = engine_with(
        settings, generating=asking({"action": "pay", "args": {"amount": 5}})
    )
    session_id = uid("s")
    send(engine, dispatcher, session_id, "hello")
    drain(engine, dispatcher)
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    assert "need_approval" in doc["metadata"]["last_error"]["detail"]
    assert approval_rows(engine, session_id) == 0


def test_the_decision_is_shown_to_the_one_phase_after_it(settings: Settings) -> None:
    seen: dict[str, Any] = {}

    def record(phase: str, trigger: str) -> Any:
        def handler(ctx: PhaseContext) -> PhaseResult:
            seen[phase] = ctx.approval
            return PhaseResult(trigger)

        return handler

    engine, dispatcher = engine_with(
        settings,
        planning=asking({"action": "pay", "args": {"amount": 5}, "ttl_s": 60}),
        executing=record("executing", "tools_complete"),
        evaluating=record("evaluating", "result_good"),
        generating=record("generating", "response_sent"),
    )
    session_id = uid("s")
    send(engine, dispatcher, session_id, "hello")
    drain(engine, dispatcher)
    snap = engine.services.sessions.load_from_database(session_id)
    assert snap is not None and snap.phase == "awaiting_approval" and snap.status == "paused"
    cutoff = utcnow() + timedelta(hours=1)
    assert session_id not in stuck_sessions(engine.services.sessions.engine, cutoff, 1000)

    desk = desk_for(engine)
    (pending,) = [a for a in desk.list() if a["session_id"] == session_id]
    desk.decide(pending["approval_id"], Decision(True, "alice", "fine"))
    drain(engine, dispatcher)
    executing = seen["executing"]
    assert (executing["action"], executing["args"], executing["by"]) == (
        "pay",
        {"amount": 5},
        "alice",
    )
    assert executing["approved"] is True and executing["note"] == "fine"
    assert seen["evaluating"] is None and seen["generating"] is None
    doc = engine.services.sessions.document(session_id)
    assert doc is not None and doc["phase"] == "idle"
    with pytest.raises(ApprovalAlreadyDecidedError, match="alice"):
        desk.decide(pending["approval_id"], Decision(False, "bob"))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"action": "x" * 129}, "'action'"),
        ({"action": "pay", "args": {"blob": "x" * 2048}}, "AGENTSTATE_MAX_STEP_IO_BYTES"),
        ({"action": "pay", "ttl_s": True}, "'ttl_s'"),
        ({"action": "pay", "ttl_s": 10**9}, "'ttl_s'"),
    ],
)
def test_request_limits(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidPayloadError, match=message):
        ApprovalRequest.parse(raw, default_ttl_s=60.0, max_args_bytes=1024)


def test_a_request_without_ttl_gets_the_default() -> None:
    parsed = ApprovalRequest.parse({"action": "pay"}, default_ttl_s=42.0, max_args_bytes=1024)
    assert (parsed.action, parsed.args, parsed.ttl_s) == ("pay", {}, 42.0)
