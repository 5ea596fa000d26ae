"""Part 3's tenancy surface, without services: both clients take ``user_id=`` on every
call that names a session, workflow or approval; the system's ``by`` markers are
reserved in any case or width; paging arguments are bounded; the errors are rooted."""

from __future__ import annotations

import inspect

import pytest

from state import errors
from state.approvals.rows import is_reserved_by
from state.paging import MAX_WHOLE, whole_number
from tasks.client import AgentClient, AsyncAgentClient

SCOPED = [
    "get_session",
    "wait_for_idle",
    "events",
    "revisions",
    "fork_session",
    "cancel_turn",
    "start_workflow",
    "get_workflow",
    "wait_for_workflow",
    "cancel_workflow",
    "retry_workflow",
    "list_sessions",
    "list_workflows",
    "approvals",
    "decide",
]


@pytest.mark.parametrize("name", SCOPED)
@pytest.mark.parametrize("client", [AgentClient, AsyncAgentClient])
def test_every_scoped_call_takes_user_id_defaulting_to_none(client: type, name: str) -> None:
    parameter = inspect.signature(getattr(client, name)).parameters["user_id"]
    assert parameter.default is None


@pytest.mark.parametrize(
    "by", ["expired", "EXPIRED", " cancelled ", "Skipped", "turn  ended", "\uff45xpired"]
)
def test_the_systems_markers_are_reserved(by: str) -> None:
    assert is_reserved_by(by)


@pytest.mark.parametrize("by", ["alice", "expired-ish", "ops team", "cancelled by bob"])
def test_a_persons_name_is_not_reserved(by: str) -> None:
    assert not is_reserved_by(by)


@pytest.mark.parametrize("value", [-1, MAX_WHOLE + 1, 10**30, True, 1.0, "1", None])
def test_paging_arguments_out_of_range_are_bad_input(value: object) -> None:
    with pytest.raises(errors.InvalidPayloadError, match="history_limit must be a whole number"):
        whole_number(value, "history_limit")


def test_the_tenancy_errors_are_rooted_where_callers_catch_them() -> None:
    assert issubclass(errors.ApprovalExpiredError, errors.ApprovalAlreadyDecidedError)
    assert issubclass(errors.SessionOwnershipError, errors.NotFoundError)
    assert issubclass(errors.WorkflowSessionNotFoundError, errors.NotFoundError)
    assert issubclass(errors.WorkflowSessionNotFoundError, errors.WorkflowSpecError)
    assert issubclass(errors.QuotaExceededError, errors.BadInputError)


def test_the_tenancy_errors_answer_http_as_their_kind() -> None:
    from tasks.server.errors import status_of

    assert status_of(errors.QuotaExceededError("x")) == (400, "bad_input")
    assert status_of(errors.ApprovalExpiredError("x")) == (409, "conflict")
    assert status_of(errors.WorkflowSessionNotFoundError("x")) == (404, "not_found")
    assert status_of(errors.SessionOwnershipError("x")) == (404, "not_found")
