"""One delivery attempt: the request signed as the Standard Webhooks specification says,
sent to the address the URL check approved, within the attempt's time limit.

Signature: ``v1,`` and the base64 of HMAC-SHA256, keyed with the secret's bytes (the
base64 after ``whsec_``), over ``{webhook-id}.{webhook-timestamp}.{body}``; the timestamp is
whole seconds since the epoch, the time of this attempt. The body is sent exactly as signed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import socket
import ssl
import time
from dataclasses import dataclass

from state.errors import WebhookSpecError
from state.webhooks.deliveries import Attempt, Outcome
from state.webhooks.hooks import secret_key
from state.webhooks.urls import Target, resolve

USER_AGENT = "agentstate-webhooks/1"
# A receiver's answer is read this far at most (only its status counts).
MAX_ANSWER_BYTES = 65536


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header's value for one attempt."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


@dataclass(frozen=True)
class SendRules:
    """AGENTSTATE_WEBHOOK_TIMEOUT and AGENTSTATE_WEBHOOK_ALLOW_PRIVATE."""

    timeout_s: float
    allow_private: bool


def attempt(delivery: Attempt, rules: SendRules) -> Outcome:
    """Send ``delivery`` once; what the receiver answered (or why there is no answer)."""
    try:
        target = resolve(delivery.url, rules.allow_private)
    except WebhookSpecError as exc:
        return Outcome(error=str(exc))
    body = delivery.payload.encode()
    timestamp = int(time.time())
    headers = {
        **delivery.headers,
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": delivery.delivery_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(delivery.secret, delivery.delivery_id, timestamp, body),
    }
    try:
        return Outcome(status_code=_post(target, body, headers, rules.timeout_s))
    except (OSError, http.client.HTTPException) as exc:
        return Outcome(error=f"{type(exc).__name__}: {exc}"[:300])


def _post(target: Target, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    conn = _connection(target, timeout_s)
    try:
        conn.request("POST", target.path, body=body, headers=headers)
        answer = conn.getresponse()
        left = MAX_ANSWER_BYTES
        while left > 0 and answer.read1(min(left, 8192)):
            left -= 8192
            if time.monotonic() > deadline:
                break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no whole answer within {timeout_s:g}s")
        return int(answer.status)
    finally:
        conn.close()


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to a URL's host that connects to an address decided already."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout_s)
        self.address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """The same over TLS: the certificate is checked for the URL's host name."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        super().__init__(
            target.host, target.port, timeout=timeout_s, context=ssl.create_default_context()
        )
        self.address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _connection(target: Target, timeout_s: float) -> http.client.HTTPConnection:
    if target.scheme == "https":
        return _PinnedHTTPS(target, timeout_s)
    return _PinnedHTTP(target, timeout_s)
