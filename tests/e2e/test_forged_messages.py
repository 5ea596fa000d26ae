"""Forged broker messages are refused one by one; no worker dies, nothing is redelivered.

Each message below is published with kombu straight onto the workers' queue, the way an
attacker (or a buggy producer) with access to the broker would. Every one of them must
be rejected and logged on one line, and the next good message must still be served by
the very same worker processes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from config import Settings
from state.sessions.snapshot import CARRY_MAX_CHARS
from state.sessions.store import SessionStore
from state.storage.backend import Backend
from tasks.client import AgentClient
from tests.support import Workers, uid

pytestmark = pytest.mark.workers

PLANNING = "agentstate.phase.planning"
STEP = "agentstate.workflow.step"
TIMEOUT = "agentstate.session.timeout"
NOOP = "agentstate.baseline.noop"
FAR_FUTURE = "2999-01-01T00:00:00+00:00"


@dataclass
class Forged:
    """One forged message: ``body`` is JSON-encoded unless ``raw`` is given."""

    label: str
    task: str = PLANNING
    body: Any = None
    raw: str | None = None
    headers: Callable[[str], dict[str, Any]] = lambda task_id: {}
    proto1: bool = False  # no ``task`` header: the task name and id are in the body

    def message(self, task_id: str) -> tuple[dict[str, Any], str]:
        """The headers and the encoded body to publish, for a message with this id."""
        if self.proto1:
            fields = {"task": self.task, "id": task_id, **self.body, **self.headers(task_id)}
            return {}, json.dumps(fields)
        headers = {"lang": "py", "task": self.task, "id": task_id, **self.headers(task_id)}
        return headers, self.raw if self.raw is not None else json.dumps(self.body)


def _args(*args: Any, **kwargs: Any) -> list[Any]:
    return [list(args), kwargs, {"callbacks": None, "errbacks": None, "chain": None}]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


SESSION = "s-forged-nobody"
CASES = [
    # The body is not [args, kwargs, embed] at all.
    Forged("a string", body="just a string"),
    Forged("an object", body={"a": 1}),
    Forged("a one-item list", body=[1]),
    Forged("null", body=None),
    Forged("a number", body=42),
    Forged("the wrong three things", body=[[], {}, "x"]),
    Forged("a 2 MB string", body="x" * 2_000_000),
    Forged("nesting too deep to decode", raw=_nested(100_000)),
    Forged("nesting that decodes", raw=f"[[{_nested(900)}], {{}}, {{}}]"),
    Forged("a million arguments", body=[[SESSION] * 1_000_000, {}, {}]),
    Forged("linked to a callback", body=[[SESSION, None], {}, {"callbacks": "x"}]),
    Forged("not JSON", raw="{nope"),
    # Well-formed bodies whose arguments do not fit the task.
    Forged("a numeric session id", body=_args(42, None)),
    Forged("an invalid session id", body=_args("bad id!", None)),
    Forged("a string version", body=_args(SESSION, "1")),
    Forged("a boolean version", body=_args(SESSION, True)),
    Forged("one argument too many", body=_args(SESSION, None, "{}", "extra")),
    Forged("a carried snapshot that is an object", body=_args(SESSION, 1, {"doc": {}})),
    Forged("a carried snapshot too big", body=_args(SESSION, 1, "x" * (CARRY_MAX_CHARS + 1))),
    Forged("an unknown keyword", body=_args(session_id=SESSION, bogus=1)),
    Forged("no arguments", body=_args()),
    Forged("a fractional step version", task=STEP, body=_args("wf-1", "a", 1.5)),
    Forged("a textual deadline", task=TIMEOUT, body=_args(SESSION, "soon")),
    Forged("a numeric counter", task=NOOP, body=_args(7)),
    # Protocol 1: the task name, id and arguments all in the body.
    Forged("proto 1, string args", proto1=True, body={"args": "just a string", "kwargs": {}}),
    Forged("proto 1, list kwargs", proto1=True, body={"args": [SESSION], "kwargs": []}),
    Forged("proto 1, numeric id", proto1=True, body={"args": [42], "kwargs": {}}),
    Forged("hybrid, string args", body={"args": "just a string", "kwargs": {}}),
    # A good body under headers Celery cannot use.
    Forged("an id that is a list", body=_args(SESSION, None), headers=lambda i: {"id": [i]}),
    Forged("a textual time limit", body=_args(SESSION, None), headers=lambda i: {"timelimit": "x"}),
    Forged("textual retries", body=_args(SESSION, None), headers=lambda i: {"retries": "x"}),
    Forged("a bad eta", body=_args(SESSION, None), headers=lambda i: {"eta": "not a date"}),
    Forged(
        "unhashable stamps",
        body=_args(SESSION, None),
        headers=lambda i: {"expires": FAR_FUTURE, "stamped_headers": [[1]], "stamps": {}},
    ),
    # Not agentstate's tasks, and still no reason to stop a worker.
    Forged("a task name that is a list", body=_args(), headers=lambda i: {"task": [i]}),
    Forged("proto 1, a list for a name", proto1=True, body={}, headers=lambda i: {"task": [i]}),
    Forged("Celery's own task, a string body", task="celery.accumulate", body="just a string"),
]


@pytest.fixture(params=["prefork", "solo"])
def pool(
    request: pytest.FixtureRequest, worker_settings: Settings, tmp_path: Path
) -> Iterator[Workers]:
    count = 2 if request.param == "prefork" else 1
    group = Workers(worker_settings, tmp_path, count=count, pool=request.param).start()
    yield group
    group.stop()


def _publish(settings: Settings, forged: Forged, task_id: str) -> None:
    queue = Queue(settings.queue, Exchange(settings.queue), routing_key=settings.queue)
    headers, body = forged.message(task_id)
    with Connection(settings.broker_url) as conn:
        Producer(conn).publish(
            body,
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            declare=[queue],
            headers=headers,
            content_type="application/json",
            content_encoding="utf-8",
        )


def _log_lines(log_dir: Path) -> list[str]:
    return [
        line
        for path in sorted(log_dir.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
    ]


def _wait_for_lines(log_dir: Path, markers: list[str], timeout: float = 60) -> list[str]:
    """The workers' log lines, once each marker is in one of them (or the time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = _log_lines(log_dir)
        text = "\n".join(lines)
        if all(marker in text for marker in markers) or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def _unacked(settings: Settings) -> str:
    """Every message the broker holds as delivered but not yet acknowledged."""
    values = redis.Redis.from_url(settings.broker_url).hvals("unacked")
    return "".join(v.decode(errors="replace") for v in values)


def test_forged_messages_are_refused_and_the_workers_keep_serving(
    pool: Workers, worker_settings: Settings, tmp_path: Path
) -> None:
    client = AgentClient(worker_settings)
    pids = sorted(pool.pids())
    ids = {case.label: f"forged-{uuid.uuid4().hex}" for case in CASES}
    for case in CASES:
        _publish(worker_settings, case, ids[case.label])

    # Published after the forged ones: a worker reaches it only past forged messages.
    session_id = uid("s")
    client.send_message(session_id, "what is 6*7?", user_id=uid("u"))
    reply = client.wait_for_idle(session_id, timeout=60)["message_history"][-1]

    assert reply["content"] == "6*7 = 42"
    # Another worker may still be decoding a big forged message the good one overtook.
    lines = _wait_for_lines(tmp_path, list(ids.values()))
    assert sorted(pool.pids()) == pids, pool.logs()  # same processes, none restarted
    for case in CASES:
        logged = [line for line in lines if ids[case.label] in line]
        assert len(logged) == 1, (case.label, logged[:3])
        assert len(logged[0]) < 1000, (case.label, logged[0][:300])
        named = "task" not in case.headers("")
        assert case.task in logged[0] or not named, (case.label, logged[0][:300])
    assert not [line for line in lines if "Traceback" in line or "Unrecoverable" in line]
    assert client.dispatcher.backlog() == 0
    assert not [case.label for case in CASES if ids[case.label] in _unacked(worker_settings)]

    pool.stop()  # a warm shutdown puts back whatever is unacknowledged: nothing
    assert client.dispatcher.backlog() == 0


def test_a_forged_snapshot_at_the_sessions_revision_commits_nothing(
    worker_settings: Settings, tmp_path: Path
) -> None:
    # Well-formed, at the right revision, for a real session: only the commit's check of
    # the carried snapshot against the row stands between it and the session.
    group = Workers(worker_settings, tmp_path, count=1, pool="prefork").start()
    try:
        client = AgentClient(worker_settings)
        session_id, user_id = uid("s"), uid("u")
        client.send_message(session_id, "what is 6*7?", user_id=user_id)
        revision = client.wait_for_idle(session_id, timeout=60)["revision"]
        backend = Backend.build(worker_settings)
        sessions = SessionStore.for_engine(backend.engine, backend.cache, backend.statements)
        snap = sessions.load_from_database(session_id)
        assert snap is not None and snap.revision == revision
        payload = snap.to_cache()
        payload["phase"] = payload["doc"]["phase"] = "planning"
        payload["doc"]["metadata"]["forged"] = True
        payload["doc"]["context_window"] = {"message": "what is 2+2?", "message_id": "m-x"}
        task_id = f"forged-{uuid.uuid4().hex}"
        body = _args(session_id, revision, json.dumps(payload))
        _publish(worker_settings, Forged("a doctored snapshot", body=body), task_id)
        lines = _wait_for_lines(tmp_path, [f"{task_id}] succeeded"])
        assert [line for line in lines if f"{task_id}] succeeded" in line], group.logs()

        client.send_message(session_id, "what is 1+2?", user_id=user_id)
        doc = client.wait_for_idle(session_id, timeout=60)
        assert doc["revision"] == revision + 6  # the second turn's six commits, no more
        assert "forged" not in doc["metadata"]
        contents = [m["content"] for m in doc["message_history"]]
        assert contents == ["what is 6*7?", "6*7 = 42", "what is 1+2?", "1+2 = 3"]
    finally:
        group.stop()
