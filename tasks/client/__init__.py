"""The Python client for apps. An app talks to agentstate only through ``AgentClient``,
so this room holds it and the mixins it is assembled from (run control, approvals, the
timeline), apart from the worker's code: importing the client sends and reads, it never
runs an agent. ``from tasks.client import AgentClient`` (and ``AsyncAgentClient``, its
asyncio twin) is the public import path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tasks.client.agent import AgentClient

if TYPE_CHECKING:
    from tasks.client.aio import AsyncAgentClient

__all__ = ["AgentClient", "AsyncAgentClient"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the CLI and the workers, which never use it, do not pay for
    # the asyncio stack's imports.
    if name == "AsyncAgentClient":
        from tasks.client.aio import AsyncAgentClient

        return AsyncAgentClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
