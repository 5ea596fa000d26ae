"""`agentstate demo`, run as a newcomer runs it: JSON output, a taken Flower port, what it
leaves in the broker, and what it says about workers it did not start."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from config import Settings
from tests.support import BROKER_URL, REPO, Workers, make_settings, settings_env, uid

pytestmark = pytest.mark.workers
AGENTSTATE = str(Path(sys.executable).with_name("agentstate"))


def demo(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTSTATE, "demo", *args],
        cwd=REPO,
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def messages_left(queue: str) -> list[str]:
    """Task names of the messages the broker still holds for ``queue`` (queued or unacked)."""
    broker = redis.Redis.from_url(BROKER_URL)
    payloads = [json.loads(raw) for raw in broker.lrange(queue, 0, -1)]
    for raw in broker.hvals("unacked"):
        payload, _exchange, routing_key = json.loads(raw)
        if routing_key == queue:
            payloads.append(payload)
    return [str(p["headers"].get("task")) for p in payloads]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_demo_json_with_flower_port_taken_leaves_nothing_in_the_broker(
    pg_url: str, taken_port: int
) -> None:
    settings = make_settings(pg_url, queue=uid("q"))
    result = demo(settings, "--json", "--workers", "1", "--flower-port", str(taken_port))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)  # stdout is the summary alone
    assert summary["turns"][0]["reply"] == "12*7 = 84"
    assert [t["path"][-1] for t in summary["turns"]] == ["idle"] * 3 + ["clarifying", "idle"]
    assert summary["user_state"]["memories"] == ["my favourite colour is teal"]
    workflow = summary["workflow"]
    assert workflow["status"] == "success"
    assert workflow["steps"]["d"]["outputs"] == {"value": (42 + 8) * (42 - 2)}
    assert summary["flower"] is None
    approval = summary["approval"]
    assert approval["approval"]["action"] == "forget_memories"
    assert (approval["approval"]["decision"], approval["approval"]["by"]) == (
        "approved",
        "demo-operator",
    )
    assert "awaiting_approval" in approval["path"]
    assert approval["reply"].startswith("Done: I have forgotten")
    assert f"port {taken_port} is taken" in result.stderr
    assert "workers stopped" in result.stderr
    # The turn that waited on its workflow must not leave its deadline check behind.
    assert messages_left(settings.queue) == []


def test_demo_with_running_workers_does_not_claim_to_stop_them(
    worker_settings: Settings, workers: Workers
) -> None:
    result = demo(worker_settings, "--no-workers", "--no-flower")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "agent> 12*7 = 84" in result.stdout
    assert "workers stopped" not in result.stdout
    assert "the workers you started keep running" in result.stdout
    assert workers.alive()
