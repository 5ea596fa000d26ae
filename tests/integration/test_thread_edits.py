"""``AgentClient.append_messages`` (what ``/lg``'s ``update_state`` calls), without
workers: messages appended to a resting session as one new revision, bad input and a
busy session refused with nothing stored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config import Settings
from state.errors import EmptyMessageError, InvalidPayloadError, SessionBusyError
from tasks.client import AgentClient
from tests.support import make_settings, uid


@pytest.fixture
def client(db_url: str) -> Iterator[AgentClient]:
    settings: Settings = make_settings(db_url, queue=uid("q"))
    yield AgentClient(settings)


def test_messages_are_appended_as_one_new_revision(client: AgentClient) -> None:
    user = uid("u")
    session_id = client.create_session(user)
    revision = client.append_messages(
        session_id,
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}],
        user_id=user,
    )
    session = client.get_session(session_id, user_id=user)
    assert session is not None and session["revision"] == revision
    history = [(m["role"], m["content"]) for m in session["message_history"]]
    assert history == [("user", "hello"), ("assistant", "hi there")]
    before = client.get_session(session_id, user_id=user, revision=revision - 1)
    assert before is not None and before["message_history"] == []


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([], InvalidPayloadError),
        ([{"role": "tool", "content": "x"}], InvalidPayloadError),
        ([{"role": "user", "content": "  "}], EmptyMessageError),
        ([{"role": "user", "content": "x", "metadata": "no"}], InvalidPayloadError),
    ],
)
def test_bad_messages_are_refused_and_nothing_is_stored(
    client: AgentClient, messages: list[dict[str, object]], error: type[Exception]
) -> None:
    user = uid("u")
    session_id = client.create_session(user)
    with pytest.raises(error):
        client.append_messages(session_id, messages, user_id=user)  # type: ignore[arg-type]
    session = client.get_session(session_id, user_id=user)
    assert session is not None and session["revision"] == 0


def test_a_busy_session_is_refused_and_nothing_is_stored(client: AgentClient) -> None:
    user = uid("u")
    session_id = client.create_session(user)
    client.send_message(session_id, "waits its turn (no workers)", user_id=user)
    before = client.get_session(session_id, user_id=user)
    with pytest.raises(SessionBusyError):
        client.append_messages(session_id, [{"role": "user", "content": "x"}], user_id=user)
    assert client.get_session(session_id, user_id=user) == before
