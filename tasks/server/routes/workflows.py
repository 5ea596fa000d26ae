"""Workflows: start one from a spec, read it with its steps' statuses, cancel it, retry it,
list workflows."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from state.errors import BadInputError, NotFoundError
from state.workflow import WorkflowStatus
from tasks.server.context import Client, Who, WorkflowId, listing_user
from tasks.server.models import (
    ID_PATTERN,
    WorkflowAccepted,
    WorkflowOut,
    WorkflowPage,
    WorkflowSpec,
)
from tasks.server.routes.sessions import CURSOR_CHARS, MAX_PAGE

router = APIRouter(prefix="/v1/workflows", tags=["workflows"])


def unknown_workflow(workflow_id: str) -> NotFoundError:
    return NotFoundError(f"unknown workflow {workflow_id!r}")


@router.post(
    "",
    status_code=202,
    summary="Start a workflow",
    description="Validates the whole spec (nothing is stored if it is bad), stores it and "
    "starts its ready steps. A user's key starts it as that user (its `session_id`, if any, "
    "must be that user's; a `user_id` naming anyone else answers 400); an operator may name "
    "the owner with `user_id`. A `workflow_id` "
    "that exists with the same spec returns that id and re-runs nothing; with another "
    "spec it answers 409.",
)
async def start_workflow(
    *,
    spec: WorkflowSpec,
    who: Who,
    client: Client,
    user_id: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
) -> WorkflowAccepted:
    if not who.operator and user_id not in (None, who.user_id):
        # Silently starting it as the key's user would hide the caller's mistake.
        raise BadInputError(
            "user_id: a user's key starts workflows as its own user; only an operator key "
            "may name another owner (nothing was started)"
        )
    owner = user_id if who.operator else who.user_id
    document = spec.model_dump(exclude_unset=True)
    workflow_id = await client.start_workflow(document, user_id=owner)
    return WorkflowAccepted(workflow_id=workflow_id)


@router.get("", summary="List workflows, newest first")
async def list_workflows(
    *,
    who: Who,
    client: Client,
    user_id: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    session_id: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    status: WorkflowStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=CURSOR_CHARS)] = None,
) -> WorkflowPage:
    user, possible = listing_user(who, user_id)
    if not possible:
        return WorkflowPage(items=[], next_cursor=None)
    page = await client.list_workflows(
        user_id=user,
        session_id=session_id,
        status=None if status is None else status.value,
        limit=limit,
        cursor=cursor,
    )
    return WorkflowPage.model_validate(page)


@router.get("/{workflow_id}", summary="Read a workflow and its steps")
async def get_workflow(*, workflow_id: WorkflowId, who: Who, client: Client) -> WorkflowOut:
    doc = await client.get_workflow(workflow_id, user_id=who.user_id)
    if doc is None:
        raise unknown_workflow(workflow_id)
    return WorkflowOut.model_validate(doc)


@router.post(
    "/{workflow_id}/cancel",
    summary="Cancel a running workflow",
    description="Its status becomes `cancelled`; every step not yet terminal ends "
    "`skipped`. A finished workflow answers 409.",
)
async def cancel_workflow(*, workflow_id: WorkflowId, who: Who, client: Client) -> WorkflowOut:
    doc = await client.cancel_workflow(workflow_id, user_id=who.user_id)
    return WorkflowOut.model_validate(doc)


@router.post(
    "/{workflow_id}/retry",
    summary="Retry a failed or cancelled workflow",
    description="Failed and skipped steps run again; successful steps keep their outputs. "
    "A running or successful workflow answers 409.",
)
async def retry_workflow(*, workflow_id: WorkflowId, who: Who, client: Client) -> WorkflowOut:
    doc = await client.retry_workflow(workflow_id, user_id=who.user_id)
    return WorkflowOut.model_validate(doc)
