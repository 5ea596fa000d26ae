"""Who is calling: the bearer key of a request, and the user it stands for.

``AGENTSTATE_API_KEYS`` lists ``key:user_id`` pairs (``key:*`` for an operator). A user
key reaches only its user's sessions, workflows and approvals; the routes pass that user
as ``user_id=`` to every client call, so another user's object answers exactly as an
unknown id does (404). Without keys configured, ``agentstate serve`` listens on loopback
only and every caller is the operator.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from config.api_keys import OPERATOR
from state.errors import ForbiddenError, UnauthorizedError

bearer = HTTPBearer(
    auto_error=False,
    description="An AGENTSTATE_API_KEYS key: `Authorization: Bearer KEY`.",
)


@dataclass(frozen=True)
class Caller:
    """Whom a request's key stands for: a user, or the operator (``user_id`` None)."""

    user_id: str | None
    # Which configured key it presented (its place in AGENTSTATE_API_KEYS; 0 without
    # keys): what per-key limits count by.
    key: int = field(default=0, compare=False)

    @property
    def operator(self) -> bool:
        return self.user_id is None


OPERATOR_CALLER = Caller(None)


class KeyTable:
    """The configured keys, checked in constant time against every one of them."""

    def __init__(self, keys: dict[str, str]) -> None:
        self.entries = [(key.encode(), user) for key, user in keys.items()]

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    def caller(self, presented: str | None) -> Caller:
        """The caller a presented key stands for; UnauthorizedError if none matches.

        Every configured key is compared, whatever matched before, so the time taken
        tells nothing about which key (or which prefix) is right.
        """
        if not self.entries:
            return OPERATOR_CALLER
        candidate = (presented or "").encode("utf-8", "surrogateescape")
        found: str | None = None
        index = 0
        for number, (key, user) in enumerate(self.entries, start=1):
            if hmac.compare_digest(key, candidate) and presented:
                found, index = user, number
        if found is None:
            raise UnauthorizedError("a valid Authorization: Bearer key is required")
        return Caller(None if found == OPERATOR else found, index)


async def caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Caller:
    """The dependency every ``/v1`` route takes."""
    table: KeyTable = request.app.state.keys
    presented = credentials.credentials if credentials is not None else None
    return table.caller(presented)


def require_operator(who: Caller) -> None:
    """Operator-only routes: a user key gets 403 (which route it is tells nothing)."""
    if not who.operator:
        raise ForbiddenError("this needs an operator key (key:* in AGENTSTATE_API_KEYS)")
