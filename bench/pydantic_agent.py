"""The Pydantic AI agent of the ``pydantic-ai`` row: Pydantic AI's offline ``TestModel``
(it calls the tool, then answers with what it returned), one tool. agentstate runs it with
``AgentstateDurability`` (workers load it as ``AGENTSTATE_AGENTS=bench=bench.pydantic_agent:
agent``); ``bench.pydantic_ai_baseline`` runs the same agent with Pydantic AI's DBOS
integration."""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models.test import TestModel

from tasks.integrations.pydantic_ai import AgentstateDurability


def lookup(q: str) -> str:
    """Look ``q`` up."""
    return f"found {q}"


def build(capability: AbstractCapability[Any]) -> Agent[None, str]:
    """The bench agent, durable through ``capability``."""
    return Agent(TestModel(), name="bench", tools=[lookup], capabilities=[capability])


agent = build(AgentstateDurability())
