"""Reading a session's past: its events (followed live, woken by the push) and the
session as it was at any kept revision."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import redis
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import InterfaceError, OperationalError

from config import redact_url
from state.documents.codec import Document
from state.errors import NotFoundError
from state.events import log
from state.events.push import FALLBACK_POLL_S, Waiter
from state.events.revisions import PastRevision, at_revision, listing
from state.events.stream import TokenMerge, TokenStream, TokenWaiter
from state.migrate import StateMigrator
from state.sessions.rows import full_document
from state.sessions.snapshot import InboxState, Snapshot
from state.sessions.store import SessionStore
from state.storage import keys
from state.storage.db import read_connection
from state.storage.tables import events, inbox, sessions

logger = logging.getLogger(__name__)

PAGE = 500
_migrator = StateMigrator()


def unknown(session_id: str) -> NotFoundError:
    """The error for a session that does not exist (or is not the caller's to read)."""
    return NotFoundError(f"unknown session {session_id!r}")


class EventFeed:
    """A session's events and revisions, read from the database."""

    def __init__(
        self,
        engine: Engine,
        client: redis.Redis,
        push: bool = True,
        stream: TokenStream | None = None,
    ) -> None:
        self.engine = engine
        self.redis = client
        self.push = push
        self.stream = stream

    def owner(self, session_id: str) -> tuple[str, int] | None:
        """The session's user and current revision (None: no such session)."""
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(sessions.c.user_id, sessions.c.revision).where(
                    sessions.c.session_id == session_id
                )
            ).first()
        return None if row is None else (str(row[0]), int(row[1]))

    def require(self, session_id: str, user_id: str | None) -> tuple[str, int]:
        """:meth:`owner`, or NotFoundError for an unknown session or another user's."""
        found = self.owner(session_id)
        if found is None or (user_id is not None and found[0] != user_id):
            raise unknown(session_id)
        return found

    # -- events ----------------------------------------------------------------

    def events(
        self,
        session_id: str,
        after: int,
        follow: bool,
        timeout: float | None,
        tokens: bool = False,
    ) -> Iterator[Document]:
        """The session's events with ``seq > after``, in order; with ``follow``, then the
        new ones as they commit, until ``timeout`` seconds have passed (None: forever);
        with ``tokens`` too, the chunks streamed meanwhile (``state.events.stream``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not follow:
            yield from self._pages(session_id, after)
            return
        if tokens and self.stream is not None:
            yield from self._with_tokens(session_id, after, deadline)
            return
        channel = keys.session_events(session_id)
        with Waiter(self.redis, [channel], self.push) as waiter:
            while True:
                for event in self._pages(session_id, after, tolerant=True):
                    after = event["seq"]
                    yield event
                remaining = FALLBACK_POLL_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return
                waiter.wait(remaining)

    def _with_tokens(
        self, session_id: str, after: int, deadline: float | None
    ) -> Iterator[Document]:
        """Follow events and chunks (see ``state.events.stream``): subscribed first, then
        the stored chunks of the message being answered, then the log; then what the two
        channels bring, in the order it comes, reading the log at each events push (and
        on the fallback poll), never per chunk."""
        assert self.stream is not None
        merge = TokenMerge()
        cursor = [after]
        waiter = TokenWaiter(self.redis, session_id, self.push)
        with waiter:
            stored = self.stream.stored(session_id) if waiter.pubsub is not None else None
            if stored is not None and self.running(session_id, stored.message_id):
                merge.catch_up(stored)
            read = True
            while True:
                if read:
                    yield from self._woven(session_id, cursor, merge, waiter)
                    yield from merge.release()
                remaining = FALLBACK_POLL_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return
                read = not waiter.wait(remaining)  # nothing came: the fallback poll reads
                for item in waiter.take():
                    if item is None:
                        yield from self._woven(session_id, cursor, merge, waiter)
                        continue
                    chunk = merge.chunk(*item)
                    if chunk is not None:
                        yield chunk

    def _woven(
        self, session_id: str, cursor: list[int], merge: TokenMerge, waiter: TokenWaiter
    ) -> Iterator[Document]:
        """The new events, each message's chunks shown before the event that ends it."""
        for event in self._pages(session_id, cursor[0], tolerant=True):
            cursor[0] = event["seq"]
            ended = merge.ending(event)
            if ended is not None:
                yield from merge.release(ended)
                for item in waiter.take_chunks(ended):
                    chunk = merge.chunk(*item)
                    if chunk is not None:
                        yield chunk
            merge.saw(event)
            yield event

    def new_events(self, session_id: str, after: int) -> list[Document]:
        """The events after ``after`` as a follower reads them (a database outage reads as
        none yet: the follower looks again on its next wake)."""
        return list(self._pages(session_id, after, tolerant=True))

    def running(self, session_id: str, message_id: str) -> bool:
        """Whether ``message_id`` is the session's message whose turn is running."""
        with read_connection(self.engine) as conn:
            state = conn.execute(
                select(inbox.c.state).where(
                    inbox.c.message_id == message_id, inbox.c.session_id == session_id
                )
            ).scalar()
        return state == InboxState.STARTED

    def _pages(self, session_id: str, after: int, tolerant: bool = False) -> Iterator[Document]:
        while True:
            try:
                with read_connection(self.engine) as conn:
                    page = log.read(conn, session_id, after, PAGE)
            except (OperationalError, InterfaceError) as exc:
                if not tolerant:
                    raise
                # Following outlives a database restart: look again on the next wake.
                logger.warning("database unreachable while following: %s", redact_url(str(exc)))
                return
            yield from page
            if len(page) < PAGE:
                return
            after = page[-1]["seq"]

    # -- revisions -------------------------------------------------------------

    def revisions(
        self, session_id: str, after: int = 0, limit: int | None = None
    ) -> list[Document]:
        """``{revision, phase, trigger, at}`` of each kept revision above ``after`` (at
        most ``limit``), oldest first."""
        with read_connection(self.engine) as conn:
            return listing(conn, session_id, after, limit)

    def session_at(
        self,
        store: SessionStore,
        session_id: str,
        revision: int,
        history_limit: int | None = None,
        before_seq: int | None = None,
    ) -> Document:
        """The session as it was when ``revision`` was committed: its document, its history
        up to then (paged as the present is: the newest ``history_limit`` items before
        ``before_seq``) and how many messages were queued then."""
        found = self.owner(session_id)
        if found is None:
            raise unknown(session_id)
        user_id, current = found
        if revision > current:
            raise NotFoundError(
                f"session {session_id} has no revision {revision} (it is at {current})"
            )
        with read_connection(self.engine) as conn:
            past = at_revision(conn, session_id, revision)
            if past is None:
                raise NotFoundError(
                    f"revision {revision} of session {session_id} is not kept "
                    "(older than AGENTSTATE_EVENTS_RETAIN_DAYS, or made before the event log)"
                )
            queued = _queued_at(conn, session_id, past)
        snapshot = Snapshot(
            session_id=session_id,
            user_id=user_id,
            phase=past.phase,
            status=past.status,
            revision=past.revision,
            doc=_current_schema(past.doc),
            message_count=past.message_count,
        )
        end = past.message_count if before_seq is None else min(before_seq, past.message_count)
        page = store.history(session_id, last=history_limit, before_seq=end)
        doc = full_document(snapshot, page)
        doc["queued"] = queued
        return doc


def _current_schema(doc: Document) -> Document:
    if _migrator.needs_migration(doc):
        doc = _migrator.migrate(doc)
    doc.pop("message_history", None)
    return doc


def _queued_at(conn: Connection, session_id: str, past: PastRevision) -> int:
    """Messages waiting when the revision was committed: accepted before its commit's
    events, and not yet taken by a turn that started at or before it."""
    accepted = func.count().filter(
        events.c.kind == log.MESSAGE_ACCEPTED, events.c.seq <= past.event_seq
    )
    started = func.count().filter(
        events.c.kind == log.TURN_STARTED, events.c.revision <= past.revision
    )
    row = conn.execute(
        select(accepted, started).where(
            events.c.session_id == session_id, events.c.seq <= past.event_seq
        )
    ).one()
    return max(0, int(row[0]) - int(row[1]))
