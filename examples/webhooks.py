"""News that leaves: a webhook told when a turn completes, each request signed as the
Standard Webhooks specification says and verified here with its own library
(`pip install standardwebhooks`).

The receiver runs in this script on 127.0.0.1, so the workers must allow private addresses
(AGENTSTATE_WEBHOOK_ALLOW_PRIVATE=true); run it next to workers and beat
(docs/guides/webhooks.md):

    python examples/webhooks.py

tests/faults/test_schedule_faults.py runs it against real workers and two beats.
"""

from __future__ import annotations

import queue
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook

from tasks.client import AgentClient

received: queue.Queue[dict[str, Any]] = queue.Queue()
secret: dict[str, str] = {}


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        # Raises unless the signature, the webhook-id and a recent timestamp match.
        event = Webhook(secret["key"]).verify(body, dict(self.headers.items()))
        received.put({"id": self.headers["webhook-id"], **event})
        self.send_response(204)  # any 2xx: delivered (5xx: tried again later; 410: stop)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    agent = AgentClient()
    user, session = f"alice-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    hook = agent.add_webhook(url, ["turn.completed", "turn.failed"], user_id=user)
    secret["key"] = hook["secret"]  # whsec_...: shown once, keep it with the receiver

    agent.send_message(session, "what is 6*7?", user_id=user)
    event = received.get(timeout=60)
    print(event["type"], event["data"]["session_id"] == session)  # turn.completed True
    (delivery,) = agent.webhook_deliveries(hook["webhook_id"], user_id=user)
    print(delivery["delivery_id"] == event["id"])  # True: its id is the webhook-id
    agent.remove_webhook(hook["webhook_id"], user_id=user)
    server.shutdown()


if __name__ == "__main__":
    main()
