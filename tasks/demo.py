"""``agentstate demo``: a conversation and a workflow through real Celery workers."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from config import get_settings, redact_url
from state.storage.db import get_engine, upgrade_schema
from tasks import progress
from tasks.processes import Flower, WorkerGroup

FLOWER_PORT = 5555
DIAMOND = {
    "steps": [
        {"step_id": "a", "action": "calculate", "inputs": {"expression": "6*7"}},
        {
            "step_id": "b",
            "action": "calculate",
            "inputs": {"expression": "a+8"},
            "dependencies": ["a"],
        },
        {
            "step_id": "c",
            "action": "calculate",
            "inputs": {"expression": "a-2"},
            "dependencies": ["a"],
        },
        {
            "step_id": "d",
            "action": "calculate",
            "inputs": {"expression": "b*c"},
            "dependencies": ["b", "c"],
        },
    ],
    "context": {"purpose": "demo diamond"},
}


def run_demo(workers: int = 2, flower: bool = True) -> int:
    """Run the demo; return an exit status."""
    settings = get_settings()
    print("agentstate demo")
    print(f"  broker   {redact_url(settings.broker_url)}")
    print(f"  database {redact_url(settings.database_url)}")
    print(f"  schema   {upgrade_schema(get_engine(settings.database_url))}")
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentstate-demo-")))
        if workers:
            stack.enter_context(_workers(workers, logs))
        if flower and importlib.util.find_spec("flower") is not None:
            stack.enter_context(_flower(logs))
        from tasks.client import AgentClient

        client = AgentClient()
        _conversation(client)
        _workflow(client)
    print("\ndone: workers stopped. Run it again, or start your own with `celery -A tasks worker`.")
    return 0


def _conversation(client: Any) -> None:
    run = uuid.uuid4().hex[:6]
    user = f"demo-user-{run}"
    first, second = f"demo-{run}-a", f"demo-{run}-b"
    print(f"\n== conversation (user {user}) ==")
    turns = [
        (first, "what is 12*7?"),
        (first, "remember that my favourite colour is teal"),
        (second, "what do you remember?"),
        (second, "???"),
        (second, "what is 2+3 and 4*5?"),
    ]
    for session_id, text in turns:
        print(f"\n[{session_id}] you> {text}")
        message_id = client.send_message(session_id, text, user_id=user)
        started = time.perf_counter()
        reply, _ = progress.TurnWatcher(client, session_id, message_id, out=sys.stdout).wait(60)
        print(f"[{session_id}] agent> {reply}   ({(time.perf_counter() - started) * 1000:.0f} ms)")
    print("\n== final state ==")
    for session_id in (first, second):
        progress.print_session(client.get_session(session_id))
    print(f"persistent state of {user}: {client.load_user_state(user)}")


def _workflow(client: Any) -> None:
    print("\n== workflow: a diamond a -> {b, c} -> d ==")
    workflow_id = client.start_workflow({**DIAMOND, "workflow_id": f"demo-{uuid.uuid4().hex[:8]}"})
    doc = progress.WorkflowWatcher(client, workflow_id, out=sys.stdout).wait(120)
    progress.print_workflow(doc)


@contextmanager
def _workers(count: int, logs: Path) -> Iterator[None]:
    print(f"\nstarting {count} worker(s) (logs in {logs}) ...")
    group = WorkerGroup(get_settings(), logs, count=count, loglevel="WARNING")
    try:
        group.start()
        print(f"{count} worker(s) ready")
        yield
    finally:
        group.stop()


@contextmanager
def _flower(logs: Path) -> Iterator[None]:
    flower = Flower(get_settings(), FLOWER_PORT, log=logs / "flower.log")
    print(f"Flower: {flower.url} (while the demo runs)")
    try:
        yield
    finally:
        flower.stop()
