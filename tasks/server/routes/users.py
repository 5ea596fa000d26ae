"""Users: who a key stands for, and erasure of everything of a user (operator only)."""

from __future__ import annotations

from fastapi import APIRouter

from tasks.server.auth import require_operator
from tasks.server.context import Client, UserId, Who
from tasks.server.models import CallerOut, Erased, ErrorOut

router = APIRouter(prefix="/v1", tags=["users"])


@router.get("/me", summary="Whom this key stands for")
async def me(*, who: Who) -> CallerOut:
    return CallerOut(user_id=who.user_id, operator=who.operator)


@router.delete(
    "/users/{user_id}",
    summary="Erase a user (operator key only)",
    responses={403: {"model": ErrorOut, "description": "a user's key: only an operator erases"}},
    description="Answers what `AgentClient.erase_user` returns: rows deleted per kind. "
    "Deletes the user's sessions and their forks, history, inbox, events, "
    "revisions, approvals, workflows and steps, the user's state, and every Redis key "
    "naming them. Idempotent: erasing again deletes nothing more. A user's key answers 403.",
)
async def erase_user(*, user_id: UserId, who: Who, client: Client) -> Erased:
    require_operator(who)
    return Erased(await client.erase_user(user_id))
