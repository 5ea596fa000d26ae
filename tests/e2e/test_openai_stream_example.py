"""examples/openai_stream_agent.py through a real worker, against a small OpenAI-compatible
server on a free port of 127.0.0.1 that streams canned chunks (no model service is
reachable here): followers get the model's pieces as chunks, in order, and the reply is
all of them; a server that fails ends the turn with an apology."""

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
PIECES = ["The ", "answer ", "is ", "forty", "-two", "."]
PAUSE_S = 0.1


class _Model(BaseHTTPRequestHandler):
    asked: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Model.asked.append({"path": self.path, "auth": self.headers["Authorization"], **body})
        if "fail" in body["messages"][-1]["content"]:
            self.send_response(500)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        events = [{"choices": [{"delta": {"role": "assistant"}}]}]
        events += [{"choices": [{"delta": {"content": piece}}]} for piece in PIECES]
        events += [{"choices": [{"delta": {}, "finish_reason": "stop"}]}]
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
            time.sleep(PAUSE_S)
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


@pytest.fixture(scope="module")
def client(
    pg_url: str, model_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    settings: Settings = make_settings(pg_url, queue=uid("q"), agent="openai_stream_agent")
    pool = Workers(settings, tmp_path_factory.mktemp("openai"), count=1)
    pool.env["PYTHONPATH"] = f"{REPO / 'examples'}:{pool.env['PYTHONPATH']}"
    pool.env.update(OPENAI_BASE_URL=model_url, OPENAI_API_KEY="sk-test", OPENAI_MODEL="canned")
    pool.start()
    yield AgentClient(make_settings(pg_url, queue=settings.queue))
    pool.stop()


def test_the_models_pieces_reach_followers_as_chunks_and_make_the_reply(
    client: AgentClient,
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "what is six times seven?", user_id=user)
    items = []
    for item in client.events(session_id, follow=True, timeout=60, tokens=True):
        items.append(item)
        if item["kind"] == "reply":
            break
    assert [i["data"]["text"] for i in items if i["kind"] == "token"] == PIECES
    assert items[-1]["data"]["text"] == "".join(PIECES)
    asked = _Model.asked[-1]
    assert asked["path"] == "/v1/chat/completions" and asked["auth"] == "Bearer sk-test"
    assert asked["stream"] is True and asked["model"] == "canned"
    assert asked["messages"][-1] == {"role": "user", "content": "what is six times seven?"}


def test_a_failing_model_ends_the_turn_with_an_apology(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "please fail", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=60)
    assert doc["message_history"][-1]["metadata"]["kind"] == "apology"
    assert "HTTP Error 500" in doc["metadata"]["last_error"]["detail"]
