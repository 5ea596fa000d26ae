"""The Python client for apps. An app talks to agentstate only through ``AgentClient``,
so this room holds it and the mixins it is assembled from (run control, approvals, the
timeline), apart from the worker's code: importing the client sends and reads, it never
runs an agent. ``from tasks.client import AgentClient`` (and ``AsyncAgentClient``, its
asyncio twin) is the public import path."""

from tasks.client.agent import AgentClient
from tasks.client.aio import AsyncAgentClient

__all__ = ["AgentClient", "AsyncAgentClient"]
