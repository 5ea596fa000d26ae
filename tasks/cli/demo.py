"""``agentstate demo``: a conversation and a workflow through real Celery workers."""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from config import get_settings, redact_url
from state.storage.db import get_engine, upgrade_schema
from tasks.cli import progress
from tasks.worker.processes import Flower, WorkerGroup, exit_on_sigterm, port_free

FLOWER_PORT = 5555
FLOWER_START_S = 15.0
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


def run_demo(
    workers: int = 2, flower: bool = True, flower_port: int = FLOWER_PORT, as_json: bool = False
) -> int:
    """Run the demo; return an exit status. With ``as_json`` the story goes to stderr and
    stdout gets one JSON summary of the turns and the workflow."""
    settings = get_settings()
    exit_on_sigterm()  # a demo ended by SIGTERM stops its workers too
    out = sys.stderr if as_json else sys.stdout
    say = partial(print, file=out, flush=True)
    schema = upgrade_schema(get_engine(settings.database_url))
    summary: dict[str, Any] = {
        "broker": redact_url(settings.broker_url),
        "database": redact_url(settings.database_url),
        "schema": schema,
        "flower": None,
    }
    say("agentstate demo")
    for key in ("broker", "database", "schema"):
        say(f"  {key:<8} {summary[key]}")
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentstate-demo-")))
        wants_flower = flower and importlib.util.find_spec("flower") is not None
        flower_proc = _start_flower(flower_port, logs, say) if wants_flower else None
        if flower_proc is not None:
            stack.callback(flower_proc.stop)
        if workers:
            stack.enter_context(_workers(workers, logs, say))
        if flower_proc is not None and flower_proc.wait_ready(FLOWER_START_S):
            summary["flower"] = flower_proc.url
            say(f"Flower: {summary['flower']} (while the demo runs)")
        elif flower_proc is not None:
            say(f"Flower did not start; going on without it (log: {logs / 'flower.log'})")
        from tasks.client import AgentClient

        client = AgentClient()
        summary.update(_conversation(client, out))
        summary["workflow"] = _workflow(client, out)
        summary["approval"] = _approval(client, summary["user_id"], out)
    if workers:
        say("\ndone: workers stopped. Run it again, or start your own: celery -A tasks worker")
    else:
        say("\ndone (the workers you started keep running).")
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
    return 0


def _conversation(client: Any, out: TextIO) -> dict[str, Any]:
    say = partial(print, file=out, flush=True)
    run = uuid.uuid4().hex[:6]
    user = f"demo-user-{run}"
    first, second = f"demo-{run}-a", f"demo-{run}-b"
    say(f"\n== conversation (user {user}) ==")
    turns = [
        (first, "what is 12*7?"),
        (first, "remember that my favourite colour is teal"),
        (second, "what do you remember?"),
        (second, "???"),
        (second, "what is 2+3 and 4*5?"),
    ]
    done = []
    for session_id, text in turns:
        say(f"\n[{session_id}] you> {text}")
        message_id = client.send_message(session_id, text, user_id=user)
        started = time.perf_counter()
        reply, path = progress.TurnWatcher(client, session_id, message_id, out=out).wait(60)
        ms = round((time.perf_counter() - started) * 1000)
        say(f"[{session_id}] agent> {progress.printable(reply)}   ({ms} ms)")
        done.append(
            {"session_id": session_id, "text": text, "reply": reply, "path": path, "ms": ms}
        )
    say("\n== final state ==")
    for session_id in (first, second):
        progress.print_session(client.get_session(session_id), out)
    user_state = client.load_user_state(user)
    say(progress.printable(f"persistent state of {user}: {user_state}"))
    return {"user_id": user, "turns": done, "user_state": user_state}


def _workflow(client: Any, out: TextIO) -> dict[str, Any]:
    print("\n== workflow: a diamond a -> {b, c} -> d ==", file=out, flush=True)
    workflow_id = client.start_workflow({**DIAMOND, "workflow_id": f"demo-{uuid.uuid4().hex[:8]}"})
    doc = progress.WorkflowWatcher(client, workflow_id, out=out).wait(120)
    progress.print_workflow(doc, out)
    return doc


def _approval(client: Any, user: str, out: TextIO) -> dict[str, Any]:
    say = partial(print, file=out, flush=True)
    session_id = f"demo-{uuid.uuid4().hex[:6]}-c"
    say(f"\n== human approval: forgetting needs a yes (user {user}) ==")
    say(f"\n[{session_id}] you> forget everything")
    message_id = client.send_message(session_id, "forget everything", user_id=user)
    waiting = client.wait_for_idle(session_id, timeout=60)
    (request,) = [a for a in client.approvals(user_id=user) if a["session_id"] == session_id]
    say(
        f"[{session_id}] the turn rests in {waiting['phase']}: "
        f"{request['action']} {json.dumps(request['args'])} (approval {request['approval_id']}, "
        f"expires {request['expires_at']})"
    )
    decided = client.decide(request["approval_id"], True, by="demo-operator", note="the user asked")
    say(f"approved by {decided['by']} ({decided['note']}); the turn goes on")
    reply, path = progress.TurnWatcher(client, session_id, message_id, out=out).wait(60)
    say(f"[{session_id}] agent> {progress.printable(reply)}")
    say(progress.printable(f"persistent state of {user}: {client.load_user_state(user)}"))
    return {"session_id": session_id, "approval": decided, "reply": reply, "path": path}


@contextmanager
def _workers(count: int, logs: Path, say: Callable[..., None]) -> Iterator[None]:
    say(f"\nstarting {count} worker(s) (logs in {logs}) ...")
    group = WorkerGroup(get_settings(), logs, count=count, loglevel="WARNING")
    try:
        group.start()
        say(f"{count} worker(s) ready")
        yield
    finally:
        group.stop()


def _start_flower(port: int, logs: Path, say: Callable[..., None]) -> Flower | None:
    if not port_free(port):
        say(f"Flower: port {port} is taken; going on without Flower (--flower-port picks another)")
        return None
    return Flower(get_settings(), port, log=logs / "flower.log")
