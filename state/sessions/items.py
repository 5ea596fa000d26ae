"""A session's history as a framework's list of items (the OpenAI Agents SDK's
``Session``: read the newest n, append, pop the last, clear).

The items are the session's own history rows, so the console shows them, the event log
tells each change, a fork shares them and ``erase_user`` deletes them, as for any turn's
messages. Each row keeps the item as it was given in ``metadata["item"]`` (what a read
gives back, exactly); its ``role`` and ``content`` are what a person reads in the
console (a message's text, a tool call's name and arguments, a tool's output).

Each write is one guarded commit of the session (a new revision, events in the same
transaction): ``history_added`` (count) or ``history_removed`` (count). A write takes
the session row's lock first, as a message's accept does, so it is ordered with them;
it is refused (``SessionBusyError``, nothing stored) while a turn runs or messages wait,
because its rows would land inside that turn. The history's numbering only grows:
removed items leave a gap (as a rolled-back turn does), so a later item never takes the
number of one a reader has seen.

Scoping: the session belongs to the user who first wrote to it. Another user's reads
find nothing; their writes raise ``SessionOwnershipError`` (a ``NotFoundError``) and
change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, delete, select, update

from state.documents import codec
from state.documents.codec import Document
from state.errors import InvalidPayloadError, SessionBusyError, SessionOwnershipError
from state.events.log import HISTORY_ADDED, HISTORY_REMOVED
from state.events.push import Notifier
from state.ids import validate_id
from state.lifecycle.rows import detach_forks
from state.machine import RESTING_PHASES
from state.paging import whole_number
from state.session import make_message
from state.sessions import inbox as inbox_rows
from state.sessions.history import read_history
from state.sessions.rows import insert_session
from state.sessions.snapshot import NewEvent, SessionChange, Snapshot
from state.sessions.store import SessionStore
from state.storage.db import read_connection
from state.storage.tables import messages, sessions

ITEM_KEY = "item"
# The roles a history row can show as they are; any other item shows as a tool's row.
MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
TOOL_ROLE = "tool"
_CONTENT_CHARS = 4000  # what the console shows of an item that is not a message


class SessionItems:
    """Reads and writes of a session's history as items (see the module docstring)."""

    def __init__(
        self,
        store: SessionStore,
        notifier: Notifier | None = None,
        *,
        max_item_bytes: int = 1 << 20,
        source: str = "items",
    ) -> None:
        self.store = store
        self.notifier = notifier
        self.max_item_bytes = max_item_bytes
        self.source = source  # the revision's trigger, and the events' ``source``

    # -- reading ---------------------------------------------------------------

    def read(self, session_id: str, user_id: str, limit: int | None = None) -> list[Document]:
        """The newest ``limit`` items (all if None) in order; [] for a session of another
        user, or none."""
        validate_id(session_id, "session")
        validate_id(user_id, "user")
        if limit is not None:
            whole_number(limit, "limit")
            if limit == 0:
                return []
        with read_connection(self.store.engine) as conn:
            if _owner(conn, session_id) != user_id:
                return []
            rows = read_history(conn, session_id, last=limit)
        return [as_item(row) for row in rows]

    # -- writing ---------------------------------------------------------------

    def add(self, session_id: str, user_id: str, items: Sequence[Document]) -> int:
        """Append ``items`` (each a JSON object of at most ``max_item_bytes``; all are
        checked before any is stored); the session is created for ``user_id`` if it does
        not exist. Returns how many were added."""
        validate_id(session_id, "session")
        validate_id(user_id, "user")
        rows = [self._row(item, n) for n, item in enumerate(_as_list(items))]
        if not rows:
            return 0
        self._write(
            session_id,
            user_id,
            create=True,
            change=lambda conn, snap: ([], rows, NewEvent(HISTORY_ADDED, self._data(len(rows)))),
        )
        return len(rows)

    def pop(self, session_id: str, user_id: str) -> Document | None:
        """Remove the newest item and return it (None if there is none)."""
        validate_id(session_id, "session")
        validate_id(user_id, "user")
        popped: list[Document] = []

        def change(conn: Connection, snap: Snapshot) -> _Change:
            last = read_history(conn, session_id, last=1)
            if not last:
                return None
            popped.append(as_item(last[0]))
            op = _forget(session_id, int(last[0]["seq"]), only=True)
            return [op], [], NewEvent(HISTORY_REMOVED, self._data(1))

        self._write(session_id, user_id, create=False, change=change)
        return popped[0] if popped else None

    def clear(self, session_id: str, user_id: str) -> int:
        """Remove every item; returns how many there were."""
        validate_id(session_id, "session")
        validate_id(user_id, "user")
        counted: list[int] = []

        def change(conn: Connection, snap: Snapshot) -> _Change:
            count = len(read_history(conn, session_id))
            if not count:
                return None
            counted.append(count)
            return (
                [_forget(session_id, 0, only=False)],
                [],
                NewEvent(HISTORY_REMOVED, self._data(count)),
            )

        self._write(session_id, user_id, create=False, change=change)
        return counted[0] if counted else 0

    def _write(
        self,
        session_id: str,
        user_id: str,
        *,
        create: bool,
        change: Callable[[Connection, Snapshot], _Change],
    ) -> None:
        with self.store.engine.begin() as conn:
            if create:
                insert_session(conn, session_id, user_id)
            # The row lock first: a message's accept and a turn's commits queue here too.
            locked = conn.execute(
                update(sessions)
                .where(sessions.c.session_id == session_id)
                .values(inbox_seq=sessions.c.inbox_seq)
            )
            if locked.rowcount != 1:
                return  # nothing to remove from a session that does not exist
            snap = self.store.load_in(conn, session_id)
            assert snap is not None
            if snap.user_id != user_id:
                raise SessionOwnershipError(f"unknown session {session_id!r}")
            _require_at_rest(conn, snap)
            planned = change(conn, snap)
            if planned is None:
                return
            ops, new_messages, event = planned
            written = self.store.commit_in(
                conn,
                snap,
                SessionChange(
                    phase=snap.phase,
                    status=snap.status,
                    doc=dict(snap.doc),
                    new_messages=new_messages,
                    ops=ops,
                    events=[event],
                    trigger=self.source,
                ),
            )
        self.store.publish(written)
        if self.notifier is not None:
            self.notifier.session(session_id)

    def _row(self, item: object, n: int) -> Document:
        what = f"item {n}"
        item = codec.require_object(item, what)
        size = codec.json_size(item, what)
        if size > self.max_item_bytes:
            raise InvalidPayloadError(
                codec.too_large(what, size, self.max_item_bytes, "AGENTSTATE_MAX_STEP_IO_BYTES")
            )
        role, content = shown(item)
        return make_message(role, content, {ITEM_KEY: item})

    def _data(self, count: int) -> Document:
        return {"count": count, "source": self.source}


# The ops to run in the commit, the rows to append and the event; None: nothing to do.
_Change = tuple[list[Callable[[Connection], None]], list[Document], NewEvent] | None


def as_item(row: Document) -> Document:
    """The item a history row holds: the one stored, else (a turn's message) the row as
    a message item ``{"role", "content"}``."""
    metadata = row.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get(ITEM_KEY), dict):
        return dict(metadata[ITEM_KEY])
    return {"role": row["role"], "content": row["content"]}


def shown(item: Document) -> tuple[str, str]:
    """The role and text a history row shows for ``item``."""
    role = item.get("role")
    if isinstance(role, str) and role in MESSAGE_ROLES:
        return role, _text(item.get("content"))
    kind = str(item.get("type") or "item")
    if isinstance(item.get("name"), str):
        text = f"{item['name']}({_text(item.get('arguments'))})"
    elif "output" in item:
        text = _text(item["output"])
    else:
        text = _text(item.get("content") or item.get("summary") or "")
    return TOOL_ROLE, f"[{kind}] {text}"[:_CONTENT_CHARS]


def _text(value: Any) -> str:
    """The readable text of a content value: a string, or the texts of its parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p.get("text") for p in value if isinstance(p, dict)]
        texts = [p for p in parts if isinstance(p, str)]
        if texts:
            return "".join(texts)
    return codec.dumps(value)[:_CONTENT_CHARS]


def _as_list(items: object) -> list[Any]:
    if isinstance(items, dict | str | bytes) or not isinstance(items, Sequence):
        raise InvalidPayloadError(
            f"items must be a list of JSON objects, got {type(items).__name__}"
        )
    return list(items)


def _owner(conn: Connection, session_id: str) -> str | None:
    row = conn.execute(
        select(sessions.c.user_id).where(sessions.c.session_id == session_id)
    ).first()
    return None if row is None else str(row[0])


def _require_at_rest(conn: Connection, snap: Snapshot) -> None:
    if snap.phase not in RESTING_PHASES:
        raise SessionBusyError(
            f"session {snap.session_id} is busy (a turn is running); nothing was changed"
        )
    if inbox_rows.has_queued(conn, snap.session_id):
        raise SessionBusyError(
            f"session {snap.session_id} is busy (messages wait for their turn); nothing was changed"
        )


def _forget(session_id: str, seq: int, *, only: bool) -> Callable[[Connection], None]:
    """The op that deletes the history item ``seq`` (``only``) or every item from ``seq``
    on: forks sharing them keep their own copy first; an item the session itself shares
    from its source leaves by sharing less."""

    def forget(conn: Connection) -> None:
        detach_forks(conn, session_id, seq)
        rows = messages.c.seq == seq if only else messages.c.seq >= seq
        conn.execute(delete(messages).where(messages.c.session_id == session_id, rows))
        prefix = conn.execute(
            select(sessions.c.prefix_count).where(sessions.c.session_id == session_id)
        ).scalar()
        if prefix is not None and int(prefix) > seq:
            conn.execute(
                update(sessions)
                .where(sessions.c.session_id == session_id)
                .values(
                    prefix_count=seq,
                    prefix_session_id=sessions.c.prefix_session_id if seq else None,
                )
            )

    return forget
