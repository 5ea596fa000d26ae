"""Shared by the fault tests: their settings, a running system, and the final check that
each accepted message was answered exactly once."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from config import HopPolicy, Settings
from tasks.client import AgentClient
from tests.services import Beat
from tests.support import Workers, make_settings, uid

HOP_POLICIES = [HopPolicy.EVERY_PHASE, HopPolicy.INLINE]


def fault_settings(database_url: str, hop_policy: HopPolicy, **overrides: Any) -> Settings:
    """Short timeouts, a sweep every second, and a queue of the test's own."""
    values: dict[str, Any] = {
        "hop_policy": hop_policy,
        "queue": uid("q"),
        "agent": "tests.agents",
        "action_modules": "tests.actions_for_tests",
        "stuck_after": 2.0,
        "sweep_interval": 1.0,
        "max_recoveries": 20,
        "lock_timeout": 2.0,
        "retry_backoff": 0.2,
    }
    values.update(overrides)
    return make_settings(database_url, **values)


@contextmanager
def running(
    settings: Settings, log_dir: Path, workers: int = 2
) -> Iterator[tuple[AgentClient, Workers]]:
    """Workers and a beat process (so the recovery sweep runs), and a client."""
    pool = Workers(settings, log_dir, count=workers).start()
    beat = Beat(settings, log_dir).start()
    try:
        yield AgentClient(settings), pool
    finally:
        beat.stop()
        pool.stop()


def send_waves(client: AgentClient, sessions: list[str], waves: int) -> dict[str, list[str]]:
    """One arithmetic question per session per wave; returns what was sent where."""
    user = uid("u")
    sent: dict[str, list[str]] = {s: [] for s in sessions}
    for wave in range(waves):
        for i, session_id in enumerate(sessions):
            text = f"what is {wave + 3}*{i + 20}?"
            client.send_message(session_id, text, user_id=user)
            sent[session_id].append(text)
    return sent


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
        assert_log_matches(client, session_id, len(questions))
    return answered


def assert_log_matches(client: AgentClient, session_id: str, questions: int) -> None:
    """The session's event log has no gap and tells each message and reply once."""
    found = list(client.events(session_id))
    assert [e["seq"] for e in found] == list(range(1, len(found) + 1)), session_id
    told = [e["kind"] for e in found]
    assert told.count("message_accepted") == told.count("reply") == questions, session_id
