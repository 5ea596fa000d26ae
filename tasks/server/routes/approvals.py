"""Approvals: the requests waiting for a person, and deciding them (the first decision
wins; a later one answers 409 naming who decided)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from state.errors import BadInputError
from tasks.server.context import ApprovalId, Client, Who, listing_user
from tasks.server.models import ID_PATTERN, ApprovalOut, DecisionIn

router = APIRouter(prefix="/v1/approvals", tags=["approvals"])


@router.get(
    "",
    summary="List approvals, newest first",
    description="The undecided ones (`pending=false`: decided ones too), at most 1,000. A "
    "user's key sees that user's only; an operator may filter with `user_id`.",
)
async def list_approvals(
    *,
    who: Who,
    client: Client,
    user_id: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    pending: bool = True,
) -> list[ApprovalOut]:
    user, possible = listing_user(who, user_id)
    if not possible:
        return []
    found = await client.approvals(user_id=user, pending=pending)
    return [ApprovalOut.model_validate(item) for item in found]


@router.post(
    "/{approval_id}",
    summary="Approve or reject",
    description="Approved, the waiting turn goes on to act (or the step runs); rejected, "
    "the turn replies without acting (or the step fails). A second decision, or one after "
    "`expires_at`, answers 409. With a user's key the decision is that user's: `by` may be "
    "left out, and any other `by` answers 400; the operator's key names who decided.",
)
async def decide(
    *, approval_id: ApprovalId, body: DecisionIn, who: Who, client: Client
) -> ApprovalOut:
    by = body.by
    if who.user_id is not None:
        if by is not None and by != who.user_id:
            raise BadInputError(
                "with a user's key an approval is decided by that user: leave 'by' out or "
                "give the key's user id"
            )
        by = who.user_id
    elif by is None:
        raise BadInputError("'by' is required with the operator's key: who decided?")
    doc = await client.decide(approval_id, body.approve, by, note=body.note, user_id=who.user_id)
    return ApprovalOut.model_validate(doc)
