"""Double texting through real workers: what a message does to a session busy answering
an earlier one (``multitask_strategy``): reject (nothing stored), interrupt (cancelled as
by cancel_turn, waiting messages too, then it runs), rollback (removed as if never sent,
then it runs), each under 8 racing senders; a late handler result is refused.

The test agent's "linger" makes executing take LINGER_S: the turn that is running."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from config import Settings
from state.errors import InvalidPayloadError, RunStateError, SessionBusyError
from tasks.client import AgentClient
from tests.agents import LINGER_S
from tests.support import Workers, agent_test_settings, uid

pytestmark = pytest.mark.workers
SENDERS = 8


@pytest.fixture(scope="module")
def client(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentClient]:
    settings: Settings = agent_test_settings(pg_url)
    pool = Workers(settings, tmp_path_factory.mktemp("double"), count=2).start()
    yield AgentClient(settings)
    pool.stop()


def wait_until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def lingering(client: AgentClient, history: int = 0) -> tuple[str, str]:
    """A session with ``history`` answered turns, then one running in executing."""
    session_id, user = uid("s"), uid("u")
    for n in range(history):
        client.send_message(session_id, f"what is {n}+1?", user_id=user)
        client.wait_for_idle(session_id, timeout=30)
    client.send_message(session_id, "linger, remember that cats purr", user_id=user)
    wait_until(lambda: client.get_session(session_id)["phase"] == "executing")  # type: ignore[index]
    return session_id, user


def contents(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in doc["message_history"]]


def check_one_reply_per_kept_message(doc: dict[str, Any]) -> None:
    """The history alternates user / assistant, each reply answering the message before."""
    history = doc["message_history"]
    assert [m["role"] for m in history] == ["user", "assistant"] * (len(history) // 2)
    for asked, answered in zip(history[::2], history[1::2], strict=True):
        assert answered["metadata"]["reply_to"] == asked["metadata"]["message_id"]


def race(client: AgentClient, session_id: str, user: str, strategy: str) -> list[Any]:
    """SENDERS callers at once, each with its own message; what each got back."""
    outcomes: list[Any] = [None] * SENDERS
    start = threading.Barrier(SENDERS)

    def send(index: int) -> None:
        start.wait()
        try:
            outcomes[index] = client.send_message(
                session_id, f"what is {index}*3?", user_id=user, multitask_strategy=strategy
            )
        except RunStateError as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_reject_refuses_a_busy_session_and_stores_nothing(client: AgentClient) -> None:
    session_id, user = lingering(client)
    before = list(client.events(session_id))
    with pytest.raises(SessionBusyError, match="busy"):
        client.send_message(session_id, "what is 1+1?", user_id=user, multitask_strategy="reject")
    assert list(client.events(session_id)) == before
    client.send_message(session_id, "what is 2+2?", user_id=user)  # waiting behind it
    with pytest.raises(SessionBusyError, match="busy"):
        client.send_message(session_id, "what is 1+1?", user_id=user, multitask_strategy="reject")
    doc = client.wait_for_idle(session_id, timeout=30)
    assert [c for _, c in contents(doc)][-1] == "2+2 = 4" and len(doc["message_history"]) == 4
    # Resting, the session takes it.
    client.send_message(session_id, "what is 1+1?", user_id=user, multitask_strategy="reject")
    assert contents(client.wait_for_idle(session_id, timeout=30))[-1] == ("assistant", "1+1 = 2")


def test_an_unknown_strategy_is_refused_and_stores_nothing(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    with pytest.raises(InvalidPayloadError, match="multitask_strategy"):
        client.send_message(session_id, "hi", user_id=user, multitask_strategy="shout")
    assert client.get_session(session_id) is None


def test_interrupt_cancels_the_running_turn_and_the_waiting_ones_then_runs(
    client: AgentClient,
) -> None:
    session_id, user = lingering(client)
    client.send_message(session_id, "what is 3+3?", user_id=user)  # waiting behind it
    client.send_message(session_id, "what is 5+5?", user_id=user, multitask_strategy="interrupt")
    doc = client.wait_for_idle(session_id, timeout=30)
    cancelled = "Cancelled: I stopped working on that."
    assert contents(doc) == [
        ("user", "linger, remember that cats purr"),
        ("assistant", cancelled),
        ("user", "what is 3+3?"),
        ("assistant", cancelled),
        ("user", "what is 5+5?"),
        ("assistant", "5+5 = 10"),
    ]
    check_one_reply_per_kept_message(doc)
    kinds = [e["kind"] for e in client.events(session_id)]
    assert kinds.count("turn_cancelled") == 2
    time.sleep(LINGER_S + 0.5)  # the lingering handler returns; its result is refused
    assert contents(client.get_session(session_id)) == contents(doc)  # type: ignore[arg-type]
    assert client.load_user_state(user).get("memories") is None


def test_rollback_removes_the_running_turn_as_if_never_sent(client: AgentClient) -> None:
    session_id, user = lingering(client, history=1)
    client.send_message(session_id, "what is 3+3?", user_id=user)  # waiting behind it
    before = client.get_session(session_id)
    assert before is not None
    client.send_message(session_id, "what is 5+5?", user_id=user, multitask_strategy="rollback")
    doc = client.wait_for_idle(session_id, timeout=30)
    assert contents(doc) == [
        ("user", "what is 0+1?"),
        ("assistant", "0+1 = 1"),
        ("user", "what is 5+5?"),
        ("assistant", "5+5 = 10"),
    ]
    check_one_reply_per_kept_message(doc)
    events = list(client.events(session_id))
    rolled = [e for e in events if e["kind"] == "turn_cancelled"]
    assert len(rolled) == 2 and all(e["data"]["rolled_back"] for e in rolled)
    assert not any(e["kind"] == "reply" and "Cancelled" in e["data"]["text"] for e in events)
    time.sleep(LINGER_S + 0.5)  # the rolled-back turn's handler returns: refused
    assert contents(client.get_session(session_id)) == contents(doc)  # type: ignore[arg-type]
    assert client.load_user_state(user).get("memories") is None


def test_rollback_restores_the_session_state_from_before_the_turn(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "what is 7*6?", user_id=user)
    rested = client.wait_for_idle(session_id, timeout=30)
    client.send_message(session_id, "linger, what is 1+2?", user_id=user)
    wait_until(lambda: client.get_session(session_id)["phase"] == "executing")  # type: ignore[index]
    client.send_message(session_id, "what is 9-1?", user_id=user, multitask_strategy="rollback")
    client.wait_for_idle(session_id, timeout=30)
    rollback = [r for r in client.revisions(session_id) if r["trigger"] == "rollback"]
    assert len(rollback) == 1
    restored = client.get_session(session_id, revision=rollback[0]["revision"])
    assert restored is not None
    assert restored["phase"] == "idle"
    ignore = {"revision", "updated_at", "queued"}
    assert {k: v for k, v in restored.items() if k not in ignore} == {
        k: v for k, v in rested.items() if k not in ignore
    }


@pytest.mark.parametrize("strategy", ["enqueue", "reject", "interrupt", "rollback"])
def test_eight_racing_senders_get_one_consistent_outcome(
    client: AgentClient, strategy: str
) -> None:
    session_id, user = lingering(client, history=1)
    outcomes = race(client, session_id, user, strategy)
    doc = client.wait_for_idle(session_id, timeout=60)
    check_one_reply_per_kept_message(doc)
    accepted = [o for o in outcomes if isinstance(o, str)]
    history = contents(doc)
    answers = [c for role, c in history if role == "assistant"]
    if strategy == "reject":
        assert all(isinstance(o, SessionBusyError) for o in outcomes)
        assert len(history) == 4 and answers[-1] != "Cancelled: I stopped working on that."
        return
    assert len(accepted) == SENDERS
    order = [
        e["data"]["message_id"]
        for e in client.events(session_id)
        if e["kind"] == "message_accepted"
    ]
    last = [m for m in order if m in accepted][-1]
    if strategy == "enqueue":
        assert len(history) == 2 + 2 + 2 * SENDERS
        assert answers[2:] == [f"{i}*3 = {i * 3}" for i in map(_index(doc), order[2:])]
    elif strategy == "interrupt":
        # Every message is in the history; all but the last accepted were cancelled.
        assert len(history) == 2 + 2 + 2 * SENDERS
        assert answers[1:-1] == ["Cancelled: I stopped working on that."] * SENDERS
        assert doc["message_history"][-1]["metadata"]["reply_to"] == last
    else:
        # Only the last accepted is left, answered; the rest never happened.
        assert len(history) == 4
        assert doc["message_history"][-1]["metadata"]["reply_to"] == last
        assert "Cancelled" not in answers[-1]


def _index(doc: dict[str, Any]) -> Any:
    by_id = {
        m["metadata"]["message_id"]: int(m["content"].split()[2].split("*")[0])
        for m in doc["message_history"]
        if m["role"] == "user" and m["content"].startswith("what is") and "*3" in m["content"]
    }
    return lambda message_id: by_id[message_id]
