"""Agents: the deployment's agents, by name and kind (``AgentClient.list_agents``)."""

from __future__ import annotations

from fastapi import APIRouter

from tasks.server.context import Client
from tasks.server.models import AgentOut

router = APIRouter(prefix="/v1", tags=["agents"])


@router.get(
    "/agents",
    summary="List the agents",
    description="`default` (AGENTSTATE_AGENT) first, then those of AGENTSTATE_AGENTS in order. "
    "A message's `agent` picks one for a new session.",
)
async def list_agents(*, client: Client) -> list[AgentOut]:
    return [AgentOut.model_validate(agent) for agent in await client.list_agents()]
