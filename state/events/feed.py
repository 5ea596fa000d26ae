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
KNOWN_MESSAGES = 256  # per follower: messages whose chunks it has checked
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

    def generation(self, session_id: str, user_id: str | None = None) -> int:
        """The session's generation (``state.storage.generations``): what a follower is
        bound to. NotFoundError for an unknown session or another user's."""
        with read_connection(self.engine) as conn:
            row = conn.execute(
                select(sessions.c.user_id, sessions.c.generation).where(
                    sessions.c.session_id == session_id
                )
            ).first()
        if row is None or (user_id is not None and row[0] != user_id):
            raise unknown(session_id)
        return int(row[1])

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
        with ``tokens`` too, the chunks streamed meanwhile (``state.events.stream``).
        Following ends when the session's generation is gone (erased or pruned): nothing
        of whoever takes the id next is read."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not follow:
            yield from self._pages(session_id, after)
            return
        try:
            generation = self.generation(session_id)
        except NotFoundError:
            return
        if tokens and self.stream is not None:
            yield from self._with_tokens(session_id, generation, after, deadline)
            return
        channel = keys.session_events(session_id)
        with Waiter(self.redis, [channel], self.push) as waiter:
            while True:
                found = self.new_events(session_id, after, generation)
                if found is None:
                    return
                for event in found:
                    after = event["seq"]
                    yield event
                if found.more:
                    continue  # more of the log is there already
                remaining = FALLBACK_POLL_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return
                waiter.wait(remaining)

    def _with_tokens(
        self, session_id: str, generation: int, after: int, deadline: float | None
    ) -> Iterator[Document]:
        """Follow events and chunks (see ``state.events.stream``): subscribed first, then
        the stored chunks of the message being answered, then the log; then what the two
        channels bring, in the order it comes, reading the log at each events push (and
        on the fallback poll), never per chunk."""
        assert self.stream is not None
        merge = TokenMerge()
        cursor = [after]
        known: dict[str, bool] = {}
        waiter = TokenWaiter(self.redis, session_id, self.push)
        with waiter:
            stored = self.stream.stored(session_id) if waiter.pubsub is not None else None
            if stored is not None and self.running(session_id, stored.message_id, generation):
                merge.catch_up(stored)
            read = True
            while True:
                if read:
                    yield from self._woven(session_id, generation, cursor, merge, waiter)
                    if cursor[0] < 0:
                        return
                    yield from merge.release()
                remaining = FALLBACK_POLL_S if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return
                read = not waiter.wait(remaining)  # nothing came: the fallback poll reads
                for item in waiter.take():
                    if item is None:
                        yield from self._woven(session_id, generation, cursor, merge, waiter)
                        if cursor[0] < 0:
                            return  # gone: the chunks after this push are not its own
                        continue
                    if not self._ours(session_id, generation, item[0], known):
                        continue
                    chunk = merge.chunk(*item)
                    if chunk is not None:
                        yield chunk

    def _ours(
        self, session_id: str, generation: int, message_id: str, known: dict[str, bool]
    ) -> bool:
        """:meth:`belongs`, asked once per message (``known``: the answers so far)."""
        if message_id not in known:
            if len(known) > KNOWN_MESSAGES:
                known.clear()
            known[message_id] = self.belongs(session_id, message_id, generation)
        return known[message_id]

    def _woven(
        self,
        session_id: str,
        generation: int,
        cursor: list[int],
        merge: TokenMerge,
        waiter: TokenWaiter,
    ) -> Iterator[Document]:
        """The new events, each message's chunks shown before the event that ends it
        (``cursor[0]`` set to -1 when the session's generation is gone)."""
        while True:
            found = self.new_events(session_id, cursor[0], generation)
            if found is None:
                cursor[0] = -1
                return
            yield from self._weave(found, cursor, merge, waiter)
            if not found.more:
                return

    @staticmethod
    def _weave(
        found: list[Document], cursor: list[int], merge: TokenMerge, waiter: TokenWaiter
    ) -> Iterator[Document]:
        for event in found:
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

    def new_events(self, session_id: str, after: int, generation: int) -> log.Page | None:
        """The next page (at most PAGE) of the events of the session's ``generation`` after
        ``after``, as a follower reads them: None if that generation is gone. A database
        outage reads as none yet: the follower looks again on its next wake. One page at
        a time, so a follower holds a page of the log, never the whole of it."""
        try:
            with read_connection(self.engine) as conn:
                return log.read_generation(conn, session_id, generation, after, PAGE)
        except (OperationalError, InterfaceError) as exc:
            # Following outlives a database restart: look again on the next wake.
            logger.warning("database unreachable while following: %s", redact_url(str(exc)))
            return log.Page()

    def belongs(self, session_id: str, message_id: str, generation: int) -> bool:
        """Whether ``message_id`` is a message of the session's ``generation``: a chunk of
        any other (a turn of an erased generation still streaming, or of the next owner
        of the id) is never shown to this generation's followers."""
        with read_connection(self.engine) as conn:
            found = conn.execute(
                select(inbox.c.seq)
                .join(sessions, sessions.c.session_id == inbox.c.session_id)
                .where(
                    inbox.c.message_id == message_id,
                    inbox.c.session_id == session_id,
                    sessions.c.generation == generation,
                )
            ).first()
        return found is not None

    def running(self, session_id: str, message_id: str, generation: int) -> bool:
        """Whether ``message_id`` is the message of the session's ``generation`` whose turn
        is running."""
        with read_connection(self.engine) as conn:
            state = conn.execute(
                select(inbox.c.state)
                .join(sessions, sessions.c.session_id == inbox.c.session_id)
                .where(
                    inbox.c.message_id == message_id,
                    inbox.c.session_id == session_id,
                    sessions.c.generation == generation,
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
