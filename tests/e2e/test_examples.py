"""The docs' examples (examples/shout_agent.py, examples/text_actions.py,
examples/refund_agent.py) run through a real worker that has ``examples/`` on its path;
this process never imports them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.support import REPO, Workers, make_settings, uid

pytestmark = pytest.mark.workers

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def worker_settings(pg_url: str) -> Settings:
    return make_settings(
        pg_url,
        queue=uid("q"),
        agent="shout_agent",
        action_modules="text_actions",
        retry_backoff=0.05,
    )


@pytest.fixture(scope="module")
def client(
    worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    pool = Workers(worker_settings, tmp_path_factory.mktemp("examples"), count=1)
    pool.env["PYTHONPATH"] = f"{EXAMPLES}:{pool.env['PYTHONPATH']}"  # as the docs say
    pool.start()
    # The app's settings name neither the agent nor the action module.
    yield AgentClient(make_settings(worker_settings.database_url, queue=worker_settings.queue))
    pool.stop()


def test_the_shout_agent_answers_asks_and_counts_across_sessions(client: AgentClient) -> None:
    user, first, second = uid("u"), uid("s"), uid("s")
    client.send_message(first, "hello there", user_id=user)
    doc = client.wait_for_idle(first, timeout=30)
    assert doc["message_history"][-1]["content"] == "HELLO THERE! (shout 1)"
    assert doc["metadata"]["last_shout"] == 1
    # Planning, executing and evaluating have no handler: they fired their default trigger.
    assert doc["metadata"]["turn"]["path"] == [
        "idle",
        "understanding",
        "planning",
        "retrieving",
        "executing",
        "evaluating",
        "generating",
        "idle",
    ]
    client.send_message(second, "?!", user_id=user)
    doc = client.wait_for_idle(second, timeout=30)
    assert doc["phase"] == "clarifying"
    assert doc["message_history"][-1]["content"] == "Say something and I will shout it."
    client.send_message(second, "fine, cats", user_id=user)
    doc = client.wait_for_idle(second, timeout=30)
    assert doc["phase"] == "idle"
    assert doc["message_history"][-1]["content"] == "FINE, CATS! (shout 2)"
    assert client.load_user_state(user)["shouts"] == 2


class _Receiver(BaseHTTPRequestHandler):
    """/flaky answers 503 once, then 200; /refuse answers 400. Every request is kept."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        self.received.append({"path": self.path, "body": body})
        seen = sum(1 for r in self.received if r["path"] == self.path)
        status = {"/flaky": 503 if seen == 1 else 200, "/refuse": 400}.get(self.path, 404)
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    _Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_text_actions_count_post_retry_and_refuse(client: AgentClient, receiver: str) -> None:
    def step(step_id: str, act: str, deps: list[str] | None = None, **inputs: Any) -> Any:
        return {"step_id": step_id, "action": act, "inputs": inputs, "dependencies": deps or []}

    spec = {
        "steps": [
            step("intro", "word_count", text="three little words"),
            step("body", "word_count", text="and then seven more words to count"),
            step("total", "total_words", ["intro", "body"]),
            step("report", "post_json", ["total"], url=f"{receiver}/flaky", body="report"),
            step("refused", "post_json", url=f"{receiver}/refuse", body="nope"),
            step("broken", "word_count", text=42),
        ]
    }
    doc = client.wait_for_workflow(client.start_workflow(spec), timeout=60)
    steps = doc["steps"]
    assert steps["total"]["outputs"] == {"words": 10}
    assert steps["report"]["status"] == "success" and steps["report"]["retry_count"] == 1
    assert steps["report"]["outputs"] == {"status": 200}
    reports = [r["body"] for r in _Receiver.received if r["path"] == "/flaky"]
    assert reports == [{"body": "report", "deps": {"total": {"words": 10}}}] * 2
    assert steps["refused"]["status"] == "failed" and steps["refused"]["retry_count"] == 0
    assert steps["refused"]["error"].endswith("refused the request: HTTP 400")
    assert steps["broken"]["status"] == "failed" and steps["broken"]["retry_count"] == 0
    assert steps["broken"]["error"] == "PermanentActionError: 'text' must be a string, not int"


@pytest.fixture(scope="module")
def refunds(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentClient]:
    settings = make_settings(pg_url, queue=uid("q"), agent="refund_agent")
    pool = Workers(settings, tmp_path_factory.mktemp("refunds"), count=1)
    pool.env["PYTHONPATH"] = f"{EXAMPLES}:{pool.env['PYTHONPATH']}"  # as the docs say
    pool.start()
    yield AgentClient(make_settings(pg_url, queue=settings.queue))
    pool.stop()


def _asks(client: AgentClient, session_id: str, user: str, text: str) -> dict[str, Any]:
    client.send_message(session_id, text, user_id=user)
    deadline = time.monotonic() + 30
    while not (pending := client.approvals(user_id=user)):
        assert time.monotonic() < deadline, "no approval was asked for"
        time.sleep(0.05)
    assert client.get_session(session_id)["phase"] == "awaiting_approval"  # type: ignore[index]
    (approval,) = pending
    assert (approval["action"], approval["args"]) == ("refund", {"order": 42})
    return approval


def test_the_refund_agent_acts_in_executing_once_approved(refunds: AgentClient) -> None:
    user, session_id = uid("u"), uid("s")
    approval = _asks(refunds, session_id, user, "please refund order 42")
    refunds.decide(approval["approval_id"], approve=True, by="ops")
    doc = refunds.wait_for_idle(session_id, timeout=30)
    assert doc["message_history"][-1]["content"] == "Refunded order 42."
    # On at executing after the "yes": retrieving did not run in this turn.
    path = doc["metadata"]["turn"]["path"]
    assert path == [
        "idle",
        "understanding",
        "planning",
        "awaiting_approval",
        "executing",
        "evaluating",
        "generating",
        "idle",
    ]
    assert refunds.load_user_state(user)["refunds"] == {approval["approval_id"]: 42}


def test_the_refund_agent_says_no_when_a_person_does(refunds: AgentClient) -> None:
    user, session_id = uid("u"), uid("s")
    approval = _asks(refunds, session_id, user, "Refund order 42 now")
    refunds.decide(approval["approval_id"], approve=False, by="bob")
    doc = refunds.wait_for_idle(session_id, timeout=30)
    assert doc["message_history"][-1]["content"] == "I did not refund order 42 (bob said no)."
    assert "executing" not in doc["metadata"]["turn"]["path"]
    assert "refunds" not in refunds.load_user_state(user)
    refunds.send_message(session_id, "hello", user_id=user)
    doc = refunds.wait_for_idle(session_id, timeout=30)
    assert doc["message_history"][-1]["content"] == "Ask me to refund an order: 'refund order 42'."
