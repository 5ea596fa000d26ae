"""Which agents a protocol door answers for, and whose name a caller's turn runs under.

``{agent}`` in a protocol's path is a name from ``GET /v1/agents``: ``default`` is the
deployment's agent (``AGENTSTATE_AGENT``). An unknown name answers 404, as an unknown
session does.
"""

from __future__ import annotations

from config import Settings
from config.agents import DEFAULT_AGENT
from state.errors import NotFoundError
from tasks.server.auth import Caller

# The user a run is stored under when an operator (or a server without keys) names none:
# a front end on a loopback server sends no user, and a session must belong to someone.
ANONYMOUS_USER = "anonymous"


def known_agents(settings: Settings) -> list[str]:
    """The agents this deployment serves (their names: nothing is imported to tell)."""
    return [DEFAULT_AGENT, *settings.agent_targets]


def require_agent(settings: Settings, name: str) -> str:
    """``name``, or NotFoundError when the deployment has no such agent."""
    if name not in known_agents(settings):
        raise NotFoundError(f"unknown agent {name!r} (GET /v1/agents lists them)")
    return name


def acting_user(who: Caller, owner: str | None, named: object = None) -> str:
    """The user a call acts for: a user key's own user; for the operator, the user it
    names, else the session's owner, else :data:`ANONYMOUS_USER`."""
    if who.user_id is not None:
        return who.user_id
    if isinstance(named, str) and named:
        return named
    return owner or ANONYMOUS_USER
