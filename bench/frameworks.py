"""Framework agents on agentstate vs their own durable engine (``make bench``'s
``pydantic-ai`` row): a Pydantic AI agent's turns per second through agentstate's workers
(every model request and tool call a recorded step, each turn walking the FSM) against the
same agent under Pydantic AI's DBOS integration, in-process, the same number of processes.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench import baselines, harness, suite, warm
from bench.harness import say
from bench.rows import Row
from tasks.client import AgentClient

AGENTS = "bench=bench.pydantic_agent:agent"


def pydantic_ai(table: list[Row], notes: list[str], scale: float, args: Any) -> None:
    """Turns/s of the Pydantic AI agent: agentstate (inline hops) vs DBOS in-process."""
    sessions, per = suite.turns_of(scale)
    settings = harness.bench_settings(agents=AGENTS, hop_policy="inline")
    with harness.workers(settings, **suite.SHAPE):
        ours = _turns_per_second(AgentClient(settings), sessions, per)
    url = baselines.dbos_database()
    prefix = f"pa-{uuid.uuid4().hex[:6]}"
    share = sessions // suite.IN_PROCESS
    shares = [(url, f"{prefix}-{p}", share, per) for p in range(suite.IN_PROCESS)]
    base = (
        share * suite.IN_PROCESS * per / warm.run_warm("bench.pydantic_ai_baseline:prepare", shares)
    )
    say(f"Pydantic AI agent: agentstate {ours:.1f}, DBOS {base:.1f} turns/s")
    table.append(
        Row(
            "turns/s Pydantic AI agent (a tool call per turn)",
            ours,
            base,
            "turns/s",
            "the same agent, Pydantic AI's DBOS integration, in-process",
            target="report",
        )
    )
    notes.append(
        f"pydantic-ai: {sessions} sessions x {per} messages, agentstate on "
        f"{suite.SHAPE_NAME} (inline hops) vs DBOS in {suite.IN_PROCESS} processes; the agent "
        "is Pydantic AI's TestModel with one tool (bench/pydantic_agent.py): each turn is two "
        "model requests and a tool call, three recorded steps either way."
    )


def _turns_per_second(client: AgentClient, sessions_n: int, per_session: int) -> float:
    warm_ids = [f"pa-warm-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    _send(client, warm_ids, 1)
    ids = [f"pa-{uuid.uuid4().hex[:6]}-{i}" for i in range(sessions_n)]
    started = time.perf_counter()
    _send(client, ids, per_session)
    return sessions_n * per_session / (time.perf_counter() - started)


def _send(client: AgentClient, ids: list[str], per_session: int) -> None:
    harness.analyze()
    for k in range(per_session):
        for session_id in ids:
            client.send_message(
                session_id, f"hello number {k}", user_id="bench-user", agent="bench"
            )
    total = len(ids) * per_session
    harness.wait_until(lambda: harness.answered(ids) >= total, 600, f"{total} turns")
