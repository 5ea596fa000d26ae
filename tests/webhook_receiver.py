"""A webhook receiver for tests: a local HTTP server that answers from a script of status
codes and verifies every request with the Standard Webhooks project's own library."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    """One request as the receiver saw it."""

    webhook_id: str
    timestamp: str
    body: bytes
    verified: Any  # the parsed body if the signature verified, else the error's text
    answered: int
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names


@dataclass
class Receiver:
    """Answers POSTs with ``script`` (then ``then``); ``secret`` verifies them (set it once
    the hook is registered). ``start`` may come later than ``url`` (a receiver that is down)."""

    script: list[int] = field(default_factory=list)
    then: int = 200
    secret: str | None = None
    port: int = 0
    received: list[Received] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.port:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/agentstate"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.take(dict(self.headers.items()), body, self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def take(self, headers: dict[str, str], body: bytes, handler: BaseHTTPRequestHandler) -> None:
        verified: Any
        try:
            verified = Webhook(self.secret or "whsec_" + "A" * 32).verify(body, headers)
        except WebhookVerificationError as exc:
            verified = f"unverified: {exc}"
        with self._lock:
            status = self.script.pop(0) if self.script else self.then
            lowered = {k.lower(): v for k, v in headers.items()}
            self.received.append(
                Received(
                    lowered.get("webhook-id", ""),
                    lowered.get("webhook-timestamp", ""),
                    body,
                    verified,
                    status,
                    lowered,
                )
            )
        handler.send_response(status)
        handler.send_header("content-length", "2")
        handler.end_headers()
        handler.wfile.write(b"ok")

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def ids(self) -> list[str]:
        with self._lock:
            return [r.webhook_id for r in self.received]

    def __iter__(self) -> Iterator[Received]:
        with self._lock:
            return iter(list(self.received))
