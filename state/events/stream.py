"""Token streaming: chunks of the answer being written, sent to followers as a handler
produces them (``ctx.stream``), through Redis only.

Chunks are not durable and not in the event log: the ``reply`` event carries the whole
text. Each chunk is numbered n = 1, 2, ... per message and, in one Lua step, appended to
the session's chunk list and published on its tokens channel. The list holds the chunks
of the message being answered (a later turn's first chunk replaces it; it expires
AGENTSTATE_SESSION_TTL after the last chunk, and goes once the reply is committed), so a
follower that connects mid-answer subscribes first, then reads the list, and drops what
it is sent again by its number: nothing is missed, nothing repeated. A flushed Redis
loses chunks, never events.

:class:`TokenMerge` is how a follower (sync or asyncio) weaves chunks into the durable
events: in order, once each, and never a chunk after the event that ends its message
(its ``reply``, or ``turn_cancelled``), which a follower gets after the chunks of a phase
that failed or was cancelled.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import redis

from config import Settings
from state.documents.codec import Document
from state.errors import InvalidPayloadError
from state.events import log
from state.events.push import Waiter
from state.storage import keys
from state.storage.redis_client import STREAM_CHUNK, STREAM_END, STREAM_READ

logger = logging.getLogger(__name__)

CHUNK_KIND = "token"  # the kind of a streamed chunk as followers see it
# The durable events that end a message: no chunk of it is shown after one.
ENDING_KINDS = frozenset({log.REPLY, log.TURN_CANCELLED})
_ENDED_KEPT = 64


def token(message_id: str, n: int, text: str) -> Document:
    """The item a follower yields for one chunk (``seq`` None: not in the log)."""
    return {
        "seq": None,
        "kind": CHUNK_KIND,
        "data": {"message_id": message_id, "n": n, "text": text},
    }


def parse_published(payload: bytes | str) -> tuple[str, int, str] | None:
    """``(message_id, n, text)`` of a chunk as published (None if it is not one)."""
    raw = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    parts = raw.split("\n", 2)
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    return parts[1], int(parts[0]), parts[2]


@dataclass(frozen=True)
class StoredChunks:
    """What the chunk list holds: the message being answered and its chunks, in order."""

    message_id: str
    chunks: list[str]


class TokenStream:
    """Sends chunks (in workers) and reads the stored ones (in followers)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.enabled = settings.events
        self.max_bytes = settings.max_stream_bytes
        self.ttl_ms = max(1, int(settings.session_ttl * 1000))
        self._chunk = client.register_script(STREAM_CHUNK)
        self._read = client.register_script(STREAM_READ)
        self._end = client.register_script(STREAM_END)

    def send(self, session_id: str, message_id: str, started: str, text: object) -> int:
        """Stream ``text`` as the next chunk of ``message_id`` (a turn started at
        ``started``, ISO time); return its n (0: not sent, Redis being away or the turn
        over). Raises InvalidPayloadError for text that is not a string, or that takes
        the turn past AGENTSTATE_MAX_STREAM_BYTES."""
        if not isinstance(text, str):
            raise InvalidPayloadError(f"a streamed chunk must be text, not {type(text).__name__}")
        if not text or not self.enabled or not message_id:
            return 0
        try:
            n = int(
                self._chunk(
                    keys=self._keys(session_id),
                    args=self._args(message_id, started, text, session_id),
                )
            )
        except redis.RedisError as exc:
            logger.debug("chunk of %s not streamed: %s", session_id, exc)
            return 0
        if n < 0:
            raise InvalidPayloadError(
                f"a turn may stream at most {self.max_bytes} bytes (AGENTSTATE_MAX_STREAM_BYTES)"
            )
        return n

    def _args(self, message_id: str, started: str, text: str, session_id: str) -> list[str | int]:
        channel = keys.session_tokens(session_id)
        return [text, message_id, started, self.max_bytes, self.ttl_ms, channel]

    def end(self, session_id: str, message_id: str) -> None:
        """Forget the chunks of ``message_id`` (its reply is committed)."""
        try:
            self._end(keys=self._keys(session_id), args=[message_id])
        except redis.RedisError as exc:
            logger.debug("chunks of %s kept until they expire: %s", session_id, exc)

    def forget(self, session_id: str) -> None:
        """Drop whatever chunks are stored for the session (it is gone: erased or pruned
        while a handler was still streaming)."""
        try:
            self.redis.delete(*self._keys(session_id))
        except redis.RedisError as exc:
            logger.debug("chunks of %s kept until they expire: %s", session_id, exc)

    def stored(self, session_id: str) -> StoredChunks | None:
        """The chunks stored for the message being answered (None: none, or Redis away)."""
        try:
            found = self._read(keys=self._keys(session_id))
        except redis.RedisError as exc:
            logger.debug("stored chunks of %s unreadable: %s", session_id, exc)
            return None
        return stored_from(found)

    @staticmethod
    def _keys(session_id: str) -> list[str]:
        return [keys.session_stream(session_id), keys.session_chunks(session_id)]


def stored_from(found: list[bytes] | None) -> StoredChunks | None:
    """The reply of the STREAM_READ script as :class:`StoredChunks`."""
    if not found:
        return None
    texts = [item.decode("utf-8", "replace") for item in found]
    return StoredChunks(texts[0], texts[1:])


@dataclass
class TokenMerge:
    """A follower's view of the chunks: which it has shown, which message they belong to,
    and which messages have ended (a chunk of one of those is never shown)."""

    current: str | None = None
    last_n: int = 0
    ended: deque[str] = field(default_factory=lambda: deque(maxlen=_ENDED_KEPT))
    # Chunks caught up from the list, not shown yet (shown after the durable events read
    # with them, or before the event that ends their message).
    caught_up: list[tuple[str, int, str]] = field(default_factory=list)

    def catch_up(self, stored: StoredChunks) -> None:
        """Hold the stored chunks of the message being answered, to show in turn."""
        self.caught_up = [
            (stored.message_id, n, text) for n, text in enumerate(stored.chunks, start=1)
        ]

    def chunk(self, message_id: str, n: int, text: str) -> Document | None:
        """The item to yield for a chunk, or None if it was shown already or its message
        has ended."""
        if message_id in self.ended:
            return None
        if message_id != self.current:
            self.current, self.last_n = message_id, 0
        if n <= self.last_n:
            return None
        self.last_n = n
        return token(message_id, n, text)

    def release(self, message_id: str | None = None) -> list[Document]:
        """The caught-up chunks (of ``message_id`` only, if given) to yield now."""
        held = [c for c in self.caught_up if message_id is None or c[0] == message_id]
        self.caught_up = [c for c in self.caught_up if c not in held]
        return [item for item in (self.chunk(*c) for c in held) if item is not None]

    def ending(self, event: Document) -> str | None:
        """The message ``event`` ends, if it ends one (a reply, a cancelled turn)."""
        if event.get("kind") not in ENDING_KINDS:
            return None
        message_id = (event.get("data") or {}).get("message_id")
        return str(message_id) if message_id else None

    def saw(self, event: Document) -> None:
        """Note a durable event shown: chunks of the message it ends are shown no more."""
        ended = self.ending(event)
        if ended is not None and ended not in self.ended:
            self.ended.append(ended)


class TokenWaiter(Waiter):
    """A :class:`Waiter` on a session's events and tokens channels that keeps what it
    receives, in order: each chunk, and None for each push of the events channel."""

    def __init__(self, client: redis.Redis, session_id: str, enabled: bool = True) -> None:
        channels = [keys.session_events(session_id), keys.session_tokens(session_id)]
        super().__init__(client, channels, enabled)
        self.tokens_channel = keys.session_tokens(session_id)
        self.received: list[tuple[str, int, str] | None] = []

    def _message(self, timeout: float) -> bool:
        message = self.pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        if message is None:
            return False
        channel = message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "replace")
        if channel == self.tokens_channel:
            parsed = parse_published(message.get("data") or b"")
            if parsed is not None:
                self.received.append(parsed)
        else:
            self.received.append(None)
        return True

    def take(self) -> list[tuple[str, int, str] | None]:
        """What arrived since the last take, in order (None: an events push)."""
        taken, self.received = self.received, []
        return taken

    def take_chunks(self, message_id: str) -> list[tuple[str, int, str]]:
        """The chunks of ``message_id`` that arrived (pulled ahead of the rest), after
        reading whatever the connection has already received."""
        if self.pubsub is not None:
            try:
                while self._message(0.0):
                    pass
            except (redis.RedisError, OSError, ValueError):
                self.close()
        chunks = [c for c in self.received if c is not None and c[0] == message_id]
        self.received = [c for c in self.received if c is None or c[0] != message_id]
        return chunks
