"""A session's timeline for apps, mixed into ``tasks.client.AgentClient``: its events
(followed live), its revisions, and forks of it at any kept revision.

Every committed change of a session appends events in its own transaction, so the log
says exactly what the database holds: it is read from the database, never from Redis (a
flushed Redis changes no answer), and the push through Redis only says when to look.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from config import Settings
from state.documents.codec import Document
from state.errors import InvalidPayloadError
from state.events.feed import EventFeed
from state.events.fork import fork_session
from state.ids import validate_id
from state.paging import check_limit, whole_number
from state.storage.backend import Backend


class Timeline:
    """The events-and-time-travel half of AgentClient (see the module docstring)."""

    settings: Settings
    backend: Backend
    feed: EventFeed

    def events(
        self,
        session_id: str,
        after: int = 0,
        follow: bool = False,
        timeout: float | None = None,
        user_id: str | None = None,
        *,
        tokens: bool = False,
    ) -> Iterator[Document]:
        """The session's events with ``seq > after``, in ``seq`` order:
        ``{seq, kind, revision, phase, at, data}``.

        With ``follow``, keep yielding new events as they commit (woken by a push, not
        by polling) until ``timeout`` seconds have passed (None: until the caller stops
        iterating). Resume after a disconnect with ``after=`` the last seq seen: nothing
        is lost or repeated. With ``user_id``, another user's session is unknown.

        With ``follow`` and ``tokens``, the chunks handlers stream (``ctx.stream``) come
        too, as they are produced, between the events:
        ``{"seq": None, "kind": "token", "data": {"message_id", "n", "text"}}``, n = 1,
        2, ... per message, each once and in order; a follower that starts mid-answer
        first gets the chunks sent so far. Chunks are not stored: the ``reply`` event
        has the whole text, and a chunk never comes after the event that ends its
        message (``reply`` or ``turn_cancelled``).

        Raises NotFoundError (before iterating) for an unknown session.
        """
        validate_id(session_id, "session")
        whole_number(after, "after")
        if user_id is not None:
            validate_id(user_id, "user")
        check_follow_arguments(timeout, tokens)
        self.feed.require(session_id, user_id)
        return self.feed.events(session_id, after, follow, timeout, tokens)

    def revisions(
        self,
        session_id: str,
        user_id: str | None = None,
        after: int | None = 0,
        limit: int | None = 1000,
    ) -> list[Document]:
        """``{revision, phase, trigger, at}`` of the kept revisions above ``after``, oldest
        first, at most ``limit`` (1 to 1000): the next page is ``after=`` the last one's
        ``revision``. None stands for the default (as AsyncAgentClient passes it on).

        ``trigger`` names what made the revision: the FSM triggers its commit fired
        (``"receive_input+intent_clear"``), or ``created``, ``fork``, ``expire``,
        ``wait_for_workflow``, ``quarantine``, ``update``.
        """
        validate_id(session_id, "session")
        after = whole_number(0 if after is None else after, "after")
        limit = check_limit(1000 if limit is None else limit)
        if user_id is not None:
            validate_id(user_id, "user")
        self.feed.require(session_id, user_id)
        return self.feed.revisions(session_id, after, limit)

    def fork_session(
        self, session_id: str, revision: int, new_session_id: str, user_id: str | None = None
    ) -> str:
        """A new session of the same user with the state and history ``session_id`` had
        at ``revision``, resting (``idle``), its log starting with a ``forked`` event
        naming the source; the source is unchanged. Returns ``new_session_id``.

        Raises NotFoundError (unknown session or revision), SessionExistsError.
        """
        validate_id(session_id, "session")
        validate_id(new_session_id, "session")
        whole_number(revision, "revision")
        if user_id is not None:
            validate_id(user_id, "user")
        return fork_session(self.backend.engine, session_id, revision, new_session_id, user_id)


def check_follow_arguments(timeout: object, tokens: object) -> None:
    """InvalidPayloadError unless ``timeout`` is None or seconds >= 0 and ``tokens`` a bool."""
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or math.isnan(timeout)
        or timeout < 0
    ):
        raise InvalidPayloadError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    if not isinstance(tokens, bool):
        raise InvalidPayloadError(f"tokens must be true or false, got {tokens!r}")
