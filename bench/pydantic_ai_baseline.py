"""The baseline of the ``pydantic-ai`` row: the bench's Pydantic AI agent under Pydantic
AI's own DBOS integration (``DBOSDurability``), one DBOS workflow per turn, its model
request and tool call DBOS steps, in-process. Each process launches DBOS (its own executor
id) and runs its share; ``bench.warm`` times them after launch and a warm-up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dbos import DBOS
from pydantic_ai.durable_exec.dbos import DBOSDurability

from bench.dbos_baseline import launch
from bench.pydantic_agent import build

agent = build(DBOSDurability())


@DBOS.workflow()
async def pydantic_ai_turn(session_id: str, text: str) -> str:
    """One turn: the agent's run, each model request and tool call a DBOS step."""
    result = await agent.run(text)
    return str(result.output)


def prepare(
    url: str, prefix: str, sessions: int, turns: int
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Launch DBOS and run one warm-up turn; return the timed run."""
    launch(url, prefix)
    asyncio.run(pydantic_ai_turn(f"{prefix}-warm", "hello"))

    async def all_turns() -> None:
        for k in range(turns):
            for i in range(sessions):
                await pydantic_ai_turn(f"{prefix}-{i}", f"hello number {k}")

    def run() -> None:
        asyncio.run(all_turns())

    return run, DBOS.destroy
