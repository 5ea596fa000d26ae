"""A session's events as Server-Sent Events.

Each durable event is one SSE message whose ``id:`` is its ``seq`` and whose ``data:`` is
the event as JSON (``{seq, kind, revision, phase, at, data}``); a token chunk
(``?tokens=true``) has no ``id:``, so a reconnecting browser resumes after the last
durable event it saw (``Last-Event-ID``) and gets the chunks it has not seen again from
the client. Every message is of the default type (``onmessage`` in a browser), the kind
being in the JSON.

A stream sends a comment every AGENTSTATE_STREAM_HEARTBEAT seconds while nothing happens
(proxies close idle connections), ends after AGENTSTATE_STREAM_MAX_SECONDS (a browser's
EventSource reconnects by itself, ``retry:`` ms later, with ``Last-Event-ID``), ends at once
when its client goes away or the server shuts down, and stops reading the event feed then.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from anyio import CancelScope
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from state.documents import codec
from state.documents.codec import Document
from state.errors import ServiceUnavailableError, TooManyRequestsError

logger = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"
_SEQ = re.compile(r"[0-9]{1,19}")
RECONNECT_MS = 1000
_BUFFER = 16


@dataclass(frozen=True)
class StreamLimits:
    """How long a stream lives and how often it says it is alive."""

    heartbeat: float
    lifetime: float


class StreamSlots:
    """Open streams of this process, at most AGENTSTATE_MAX_STREAMS, and at most
    AGENTSTATE_MAX_STREAMS_PER_KEY of one key, so one key cannot hold every slot (the
    event loop's own counts: no lock needed)."""

    def __init__(self, limit: int, per_key: int | None = None) -> None:
        self.limit = limit
        self.per_key = per_key
        self.open = 0
        self.by_key: dict[int, int] = {}

    def take(self, key: int = 0) -> Callable[[], None]:
        """A slot for a stream of ``key`` (its release); ServiceUnavailableError when all
        are taken, TooManyRequestsError when ``key`` holds its share."""
        if self.open >= self.limit:
            raise ServiceUnavailableError(
                f"AGENTSTATE_MAX_STREAMS ({self.limit}) event streams are open; try again"
            )
        held = self.by_key.get(key, 0)
        if self.per_key is not None and held >= self.per_key:
            raise TooManyRequestsError(
                f"this key holds AGENTSTATE_MAX_STREAMS_PER_KEY ({self.per_key}) open event "
                "streams; close one first"
            )
        self.open += 1
        self.by_key[key] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open -= 1
                left = self.by_key[key] - 1
                if left:
                    self.by_key[key] = left
                else:
                    del self.by_key[key]

        return release


# The last message of a stream whose session's generation is gone (erased or pruned):
# a browser's EventSource sees an ``end`` event and need not reconnect to someone else's.
GONE: Document = {"seq": None, "kind": "end", "data": {"reason": "gone"}}


async def until_gone(source: AsyncIterator[Document]) -> AsyncIterator[Document]:
    """``source`` (a follow without a timeout, which ends only when its session's
    generation is gone), then :data:`GONE`."""
    try:
        async for event in source:
            yield event
    finally:
        closer = getattr(source, "aclose", None)
        if closer is not None:
            await closer()
    yield GONE


def encode(event: Document) -> bytes:
    """One SSE message: ``id:`` (durable events only) and the JSON on one ``data:`` line;
    :data:`GONE` as ``event: end``."""
    if event is GONE:
        return f"event: end\ndata: {codec.dumps(GONE['data'])}\n\n".encode()
    head = f"id: {event['seq']}\n" if event.get("seq") is not None else ""
    return f"{head}data: {codec.dumps(event)}\n\n".encode()


def last_event_id(header: str | None) -> int | None:
    """The seq a ``Last-Event-ID`` header names (None: absent or not a seq of ours)."""
    # ASCII digits only: str.isdigit() also takes '²', which int() then refuses.
    if header is None or not _SEQ.fullmatch(header.strip()):
        return None
    value = int(header.strip())
    return value if value < 2**63 else None


class EventStream(Response):
    """An answer that streams ``source`` until it ends, the client leaves, the server
    drains, or the lifetime is up."""

    media_type = MEDIA_TYPE

    def __init__(
        self,
        source: AsyncIterator[Document],
        limits: StreamLimits,
        draining: anyio.Event,
        release: Callable[[], None],
        encoder: Callable[[Document], bytes] = encode,
    ) -> None:
        super().__init__(
            status_code=200,
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        # A stream has no length: drop the ``content-length: 0`` of an empty Response.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.source = source
        self.limits = limits
        self.draining = draining
        self.release = release
        self.encoder = encoder  # a protocol's own framing (AG-UI: ``data:`` lines only)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._stream(receive, send)
        finally:
            self.release()

    async def _stream(self, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await _chunk(send, f"retry: {RECONNECT_MS}\n\n".encode())
        sender, receiver = anyio.create_memory_object_stream[Document](_BUFFER)
        async with anyio.create_task_group() as group:
            group.start_soon(self._pump, sender)
            group.start_soon(_until_disconnect, receive, group.cancel_scope)
            group.start_soon(self._until_draining, group.cancel_scope)
            with anyio.move_on_after(self.limits.lifetime):
                await self._write(receiver, send)
            group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, sender: MemoryObjectSendStream[Document]) -> None:
        try:
            async with sender:
                async for event in self.source:
                    await sender.send(event)
        except Exception as exc:  # the answer has begun: the stream can only end
            logger.warning("event stream ended early: %s", exc)
        finally:
            with anyio.CancelScope(shield=True):
                closer = getattr(self.source, "aclose", None)
                if closer is not None:
                    await closer()

    async def _write(self, receiver: MemoryObjectReceiveStream[Document], send: Send) -> None:
        async with receiver:
            while True:
                with anyio.move_on_after(self.limits.heartbeat) as quiet:
                    try:
                        event = await receiver.receive()
                    except anyio.EndOfStream:
                        return
                if quiet.cancelled_caught:
                    await _chunk(send, b": heartbeat\n\n")
                    continue
                await _chunk(send, self.encoder(event))

    async def _until_draining(self, scope: CancelScope) -> None:
        await self.draining.wait()
        scope.cancel()


async def _until_disconnect(receive: Receive, scope: CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _chunk(send: Send, body: bytes) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": True})
