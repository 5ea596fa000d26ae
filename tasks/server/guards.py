"""What one request may cost: a bounded body, and a time limit until its answer starts.

Both are plain ASGI middleware, outside the routes, so no route can forget them:

- ``BodyLimit`` reads a body up to AGENTSTATE_MAX_REQUEST_BYTES before the app sees it
  (a larger one, announced or streamed, answers 413 and reaches no route);
- ``TimeLimit`` answers 503 (kind ``timeout``) when a handler has not begun its answer
  within AGENTSTATE_REQUEST_TIME_LIMIT. An event stream has started its answer, so it
  runs on under its own limits (AGENTSTATE_STREAM_MAX_SECONDS).
"""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tasks.server.errors import error_response


class BodyLimit:
    """Refuse request bodies larger than ``limit`` bytes with 413."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        announced = _content_length(scope)
        if announced is not None and announced > self.limit:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: only the disconnect is left

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = (
            f"the request body is larger than AGENTSTATE_MAX_REQUEST_BYTES ({self.limit} bytes)"
        )
        await error_response(413, "bad_input", message)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class TimeLimit:
    """Answer 503 when a handler has not begun its answer within ``seconds``.

    A timer, not a deadline on the handler: once an answer has begun nothing cancels it,
    however close to the limit it began (a deadline that had already passed would).
    """

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = timed_out = False
        handler, timer = anyio.CancelScope(), anyio.CancelScope()

        async def expire() -> None:
            nonlocal timed_out
            with timer:
                await anyio.sleep(self.seconds)
                if not started:
                    timed_out = True
                    handler.cancel()

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True  # before any await: the timer can no longer fire
                timer.cancel()
            await send(message)

        async with anyio.create_task_group() as group:
            group.start_soon(expire)
            with handler:
                await self.app(scope, receive, watched)
            timer.cancel()
        if timed_out and not started:
            message = (
                f"no answer within AGENTSTATE_REQUEST_TIME_LIMIT ({self.seconds:g} s); "
                "a write may still have happened: repeat it with the same Idempotency-Key"
            )
            await error_response(503, "timeout", message)(scope, receive, send)


# The console is our own files only: no inline script, no other origin, no framing.
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders:
    """Add the headers above to every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
