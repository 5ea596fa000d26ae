"""An AgentClient made before a fork (as a pre-fork server's app module makes it) works in
the parent and in every child: none of them shares a pooled connection (database, Redis
or broker).

Postgres, Redis and the broker are real; the children are plain ``os.fork()`` children,
like gunicorn's or a prefork pool's, and report through pipes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
from typing import Any

import redis

from tasks.client import AgentClient
from tests.support import make_settings, uid

CHILDREN = 3
READS = 300
SENDS = 5
MAX_REPORTED = 5
CHILD_TIMEOUT_S = 120.0
COMPARED = ("session_id", "user_id", "phase", "_version", "message_history", "queued")


def exercise(client: AgentClient, session_id: str, expected: dict[str, Any]) -> dict[str, Any]:
    """READS reads of an existing session, and SENDS messages, each to a new session of
    its own (so that each one kicks its session: a message behind a waiting one would
    not); every exception and every wrong answer counts as an error."""
    own_sessions, errors = [uid("fork") for _ in range(SENDS)], []
    for i in range(READS):
        try:
            doc = client.get_session(session_id)
            if doc is None or {key: doc[key] for key in COMPARED} != expected:
                errors.append(f"get_session read back {doc!r:.200}")
            if i % (READS // SENDS) == 0:
                send(client, own_sessions[i // (READS // SENDS)])
        except Exception:
            errors.append(traceback.format_exc(limit=3))
    return {
        "errors": len(errors),
        "first": errors[:MAX_REPORTED],
        "sessions": own_sessions,
        # Object ids survive fork(): equal ids mean the very pool the parent made.
        "broker_pool": id(client.dispatcher.app.pool),
    }


def send(client: AgentClient, session_id: str) -> str:
    return client.send_message(session_id, "what is 2*21?", user_id=f"user-{session_id}")


def fork_child(client: AgentClient, session_id: str, expected: dict[str, Any]) -> tuple[int, int]:
    """Fork a child that runs ``exercise`` and writes its report to a pipe: (pid, pipe)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid != 0:
        os.close(write_end)
        return pid, read_end
    os.close(read_end)
    status = 1
    try:
        report = exercise(client, session_id, expected)
        status = 0
    except BaseException:
        report = {"fatal": traceback.format_exc()}
    finally:
        os.write(write_end, json.dumps(report).encode())
        os._exit(status)  # no atexit handlers, no pytest teardown in the child


def collect(pid: int, read_end: int, deadline: float) -> tuple[int, dict[str, Any]]:
    """The child's exit status and report (a child that hangs is killed and reported)."""
    chunks = []
    while True:
        ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            chunks = [json.dumps({"fatal": "the child hung"}).encode()]
            break
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), json.loads(b"".join(chunks) or b'{"fatal": "none"}')


def test_a_client_made_before_fork_works_in_every_child_and_the_parent(pg_url: str) -> None:
    settings = make_settings(pg_url, queue=uid("q"))
    client = AgentClient(settings)
    session_id = uid("s")
    send(client, session_id)  # no worker runs: the message stays queued
    before = client.get_session(session_id)
    assert before is not None and before["queued"] == 1
    expected = {key: before[key] for key in COMPARED}
    for _ in range(20):  # the pools now hold idle connections, as a long-lived app's do
        assert client.get_session(session_id) == before

    children = [fork_child(client, session_id, expected) for _ in range(CHILDREN)]
    parent = exercise(client, session_id, expected)  # while the children run
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    results = [collect(pid, read_end, deadline) for pid, read_end in children]

    for status, report in results:
        assert "fatal" not in report, report["fatal"]
        assert (status, report["errors"]) == (0, 0), report["first"]
        assert report["broker_pool"] != parent["broker_pool"], "the parent's broker connections"
    assert parent["errors"] == 0, parent["first"]
    # Every message each process sent is stored in its session and its kick enqueued once.
    for report in [parent, *(report for _, report in results)]:
        for own_session in report["sessions"]:
            doc = client.get_session(own_session)
            assert doc is not None and doc["queued"] == 1, (own_session, doc)
    assert redis.Redis.from_url(settings.broker_url).llen(settings.queue) == 1 + SENDS * (
        CHILDREN + 1
    )
    assert client.get_session(session_id) == before
