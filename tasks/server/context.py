"""What a route needs from the process: the client, the settings, and the rules that turn
a key's user into the ``user_id=`` a call passes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from config import Settings
from state.errors import NotFoundError
from tasks.client.aio import AsyncAgentClient
from tasks.server.auth import Caller, caller
from tasks.server.models import ID_PATTERN

Who = Annotated[Caller, Depends(caller)]
SessionId = Annotated[str, Path(pattern=ID_PATTERN, description="a session id")]
WorkflowId = Annotated[str, Path(pattern=ID_PATTERN, description="a workflow id")]
ApprovalId = Annotated[str, Path(pattern=ID_PATTERN, description="an approval id")]
UserId = Annotated[str, Path(pattern=ID_PATTERN, description="a user id")]


def client_of(request: Request) -> AsyncAgentClient:
    """The process's client (see ``tasks.server.backend``)."""
    client: AsyncAgentClient = request.app.state.client
    return client


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


Client = Annotated[AsyncAgentClient, Depends(client_of)]
Config = Annotated[Settings, Depends(settings_of)]


def listing_user(who: Caller, requested: str | None) -> tuple[str | None, bool]:
    """The ``user_id`` a listing filters on, and whether it can find anything at all: a
    user's key lists that user's objects only (asking for another user's finds none)."""
    if who.operator:
        return requested, True
    return who.user_id, requested in (None, who.user_id)


def unknown_session(session_id: str) -> NotFoundError:
    """What another user's session, or one that does not exist, answers."""
    return NotFoundError(f"unknown session {session_id!r}")
