"""What every fault test checks at the end: each accepted message answered exactly once."""

from __future__ import annotations

import re
import time
from typing import Any

from tasks.client import AgentClient


def wait_all_idle(client: AgentClient, sessions: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for session_id in sessions:
        client.wait_for_idle(session_id, timeout=max(1.0, deadline - time.monotonic()))


def assert_answered_exactly_once(client: AgentClient, sent: dict[str, list[str]]) -> int:
    """Every sent question is in its session once, followed by its one correct reply."""
    answered = 0
    for session_id, questions in sent.items():
        doc = client.get_session(session_id)
        assert doc is not None and doc["phase"] in ("idle", "clarifying"), session_id
        history: list[dict[str, Any]] = doc["message_history"]
        assert [m["role"] for m in history] == ["user", "assistant"] * len(questions), (
            session_id,
            [(m["role"], m["content"]) for m in history],
        )
        assert [m["content"] for m in history[::2]] == questions
        for question, reply in zip(history[::2], history[1::2], strict=True):
            assert reply["metadata"]["reply_to"] == question["metadata"]["message_id"]
            a, b = map(int, re.findall(r"\d+", question["content"]))
            assert reply["content"] == f"{a}*{b} = {a * b}", (question, reply)
            answered += 1
    return answered
