"""Events and time travel through real workers: the event log of every committed change,
followed live (pushed), resumable, the same after Redis is flushed; every revision
readable, and forkable; retention that keeps the current state.

The workers' Redis (cache, locks, pushes) is a private redis-server, so that FLUSHALL
here is a real one; the broker stays on the test broker's DB index.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select, update

from config import Settings
from config.celery import celery_config
from state.clock import utcnow
from state.errors import InvalidPayloadError, NotFoundError, SessionExistsError
from state.storage import keys
from state.storage.db import get_engine
from state.storage.tables import events, revisions
from tasks.app import make_app
from tasks.client import AgentClient
from tasks.worker.base import AgentStateTask
from tasks.worker.maintenance import PRUNE_TASK, prune_events
from tests.services import PrivateRedis
from tests.support import REPO, Workers, agent_test_settings, settings_env, uid

pytestmark = pytest.mark.workers
AGENTSTATE = str(Path(sys.executable).with_name("agentstate"))


@pytest.fixture(scope="module")
def events_settings(pg_url: str, private_redis: PrivateRedis) -> Settings:
    return agent_test_settings(pg_url, redis_url=f"{private_redis.url}/0")


@pytest.fixture(scope="module")
def client(
    events_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    pool = Workers(events_settings, tmp_path_factory.mktemp("events"), count=2).start()
    yield AgentClient(events_settings)
    pool.stop()


def log_of(client: AgentClient, session_id: str, after: int = 0) -> list[dict[str, Any]]:
    return list(client.events(session_id, after=after))


def kinds(found: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in found]


def turn_ends(found: list[dict[str, Any]]) -> int:
    """How many turns ended in ``found`` (a commit back to a resting phase)."""
    return sum(
        1 for e in found if e["kind"] == "phase_committed" and e["phase"] in ("idle", "clarifying")
    )


def wait_until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


# -- the log -------------------------------------------------------------------------


def test_a_turn_tells_its_story_in_order(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "what is 2+3?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    found = log_of(client, session_id)
    assert [e["seq"] for e in found] == list(range(1, len(found) + 1))
    assert set(found[0]) == {"seq", "kind", "revision", "phase", "at", "data"}
    assert kinds(found)[:2] == ["message_accepted", "turn_started"]
    assert found[0]["data"]["text"] == "what is 2+3?" and found[0]["revision"] == 0
    assert kinds(found)[-2:] == ["reply", "phase_committed"]
    assert found[-2]["data"]["text"] == doc["message_history"][-1]["content"] == "2+3 = 5"
    committed = [e for e in found if e["kind"] == "phase_committed"]
    assert [e["revision"] for e in committed] == list(range(1, doc["revision"] + 1))
    assert [e["phase"] for e in committed] == doc["metadata"]["turn"]["path"][2:]
    listed = client.revisions(session_id)
    assert [r["revision"] for r in listed] == list(range(doc["revision"] + 1))
    assert [r["phase"] for r in listed[1:]] == [e["phase"] for e in committed]
    assert listed[0]["trigger"] == "created"
    assert listed[1]["trigger"] == "receive_input+intent_clear"
    assert listed[-1]["trigger"] == "response_sent"


def test_six_threads_sending_to_one_session_make_a_gap_free_log(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    start = threading.Barrier(6)

    def send(thread: int) -> None:
        start.wait()
        for k in range(5):
            client.send_message(session_id, f"thread {thread} says hello {k}", user_id=user)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    doc = client.wait_for_idle(session_id, timeout=120)
    found = log_of(client, session_id)
    assert [e["seq"] for e in found] == list(range(1, len(found) + 1))
    counts = {kind: kinds(found).count(kind) for kind in set(kinds(found))}
    assert counts["message_accepted"] == counts["turn_started"] == counts["reply"] == 30
    revisions_seen = [e["revision"] for e in found]
    assert revisions_seen == sorted(revisions_seen)  # appended in commit order
    committed = [e["revision"] for e in found if e["kind"] == "phase_committed"]
    assert committed == list(range(1, doc["revision"] + 1))
    # Each turn starts the message accepted first among those still waiting.
    accepted = [e["data"]["message_id"] for e in found if e["kind"] == "message_accepted"]
    started = [e["data"]["message_id"] for e in found if e["kind"] == "turn_started"]
    assert started == accepted
    history_ids = [m["metadata"]["message_id"] for m in doc["message_history"][::2]]
    assert history_ids == started


def test_the_log_is_the_same_after_redis_is_flushed(
    client: AgentClient, private_redis: PrivateRedis
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "what is 2+3 and 4*5?", user_id=user)
    client.wait_for_idle(session_id, timeout=60)
    before = log_of(client, session_id)
    private_redis.flushall()
    assert log_of(client, session_id) == before
    client.send_message(session_id, "what is 9*9?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=60)
    after = log_of(client, session_id, after=before[-1]["seq"])
    assert after[0]["seq"] == before[-1]["seq"] + 1 and after[0]["kind"] == "message_accepted"
    assert log_of(client, session_id) == before + after
    assert doc["message_history"][-1]["content"] == "9*9 = 81"


def test_a_follower_started_before_a_turn_gets_each_event_once_in_order(
    client: AgentClient, private_redis: PrivateRedis
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "hello", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    start = log_of(client, session_id)[-1]["seq"]
    got: list[dict[str, Any]] = []

    def follow() -> None:
        for event in client.events(session_id, after=start, follow=True, timeout=60):
            got.append(event)
            if turn_ends(got) == 2:
                return

    follower = threading.Thread(target=follow)
    follower.start()
    client.send_message(session_id, "what is 2+3?", user_id=user)
    wait_until(lambda: turn_ends(got) == 1)
    private_redis.flushall()  # the follower's wake-ups survive it; the log is in Postgres
    client.send_message(session_id, "what is 6*7?", user_id=user)
    follower.join(60)
    assert not follower.is_alive()
    assert got == log_of(client, session_id, after=start)
    assert [e["seq"] for e in got] == list(range(start + 1, start + 1 + len(got)))


def test_each_commit_pushes_to_the_session_channel(
    client: AgentClient, private_redis: PrivateRedis
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "hello", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    pubsub = redis.Redis.from_url(private_redis.url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.session_events(session_id))
    wait_until(lambda: pubsub.get_message(timeout=0.1) is None and pubsub.subscribed)
    before = len(log_of(client, session_id))
    client.send_message(session_id, "what is 2+3?", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    pushes = 0
    while pubsub.get_message(timeout=0.5) is not None:
        pushes += 1
    pubsub.close()
    new = log_of(client, session_id, after=before)
    commits = kinds(new).count("phase_committed")
    # One push for the accepted message, one per committed phase (every_phase policy).
    assert pushes == commits + 1


def test_a_follower_killed_and_restarted_from_its_last_seq_misses_nothing(
    client: AgentClient, events_settings: Settings
) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "hello", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    first = _cli_follower(events_settings, session_id, 0)
    seen = _read_lines(first, len(log_of(client, session_id)))
    for text in ("what is 2+3?", "what is 4*5?", "what is 6*7?"):
        client.send_message(session_id, text, user_id=user)
    seen += _read_lines(first, 5)
    first.kill()  # mid-stream: whatever it had not printed yet is gone with it
    first.wait(10)
    client.wait_for_idle(session_id, timeout=60)
    total = len(log_of(client, session_id))
    second = _cli_follower(events_settings, session_id, seen[-1]["seq"])
    seen += _read_lines(second, total - len(seen))
    second.kill()
    second.wait(10)
    assert [e["seq"] for e in seen] == list(range(1, total + 1))
    assert seen == log_of(client, session_id)
    assert turn_ends(seen) == 4


def _cli_follower(settings: Settings, session_id: str, after: int) -> subprocess.Popen[str]:
    command = [AGENTSTATE, "session", "events", session_id, "--follow", "--json"]
    return subprocess.Popen(
        [*command, "--after", str(after), "--timeout", "90"],
        cwd=REPO,
        env=settings_env(settings),
        stdout=subprocess.PIPE,
        text=True,
    )


def _read_lines(proc: subprocess.Popen[str], count: int) -> list[dict[str, Any]]:
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout

    def pump() -> None:
        for _ in range(count):
            line = stdout.readline()
            if not line:
                return
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return [json.loads(lines.get(timeout=60)) for _ in range(count)]


# -- handlers' own events ------------------------------------------------------------


def test_a_handlers_events_commit_with_its_phase_or_not_at_all(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "narrate what is 2+2?", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    found = log_of(client, session_id)
    own = [e for e in found if e["kind"].startswith("tool.")]
    assert [(e["kind"], e["data"]) for e in own] == [
        ("tool.called", {"tool": "calculator", "attempt": 1}),
        ("tool.done", {}),
    ]
    closing = found[found.index(own[-1]) + 1]
    assert closing["kind"] == "phase_committed" and closing["data"]["from"] == "executing"
    assert own[0]["revision"] == closing["revision"]

    client.send_message(session_id, "misnarrate what is 2+2?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=30)
    later = log_of(client, session_id, after=found[-1]["seq"])
    assert not [e for e in later if e["kind"].startswith("tool.")]
    failed = [e for e in later if e["kind"] == "turn_failed"]
    assert len(failed) == 1 and failed[0]["data"]["phase"] == "executing"
    assert "agentstate's own" in failed[0]["data"]["detail"]
    assert doc["message_history"][-1]["metadata"]["kind"] == "apology"


def test_workflow_start_and_finish_are_in_the_log(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "what is 2+3 and 4*5?", user_id=user)
    doc = client.wait_for_idle(session_id, timeout=60)
    found = log_of(client, session_id)
    workflow_id = doc["metadata"]["workflows"][-1]
    started = [e for e in found if e["kind"] == "workflow_started"]
    finished = [e for e in found if e["kind"] == "workflow_finished"]
    assert [e["data"] for e in started] == [{"workflow_id": workflow_id}]
    assert [e["data"] for e in finished] == [{"workflow_id": workflow_id, "status": "success"}]
    assert found.index(started[0]) < found.index(finished[0]) < kinds(found).index("reply")
    assert [e["seq"] for e in found] == list(range(1, len(found) + 1))


def test_a_cancelled_turn_and_its_workflow_are_in_the_log(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    client.send_message(session_id, "slowflow please", user_id=user)
    wait_until(lambda: "workflow_started" in kinds(log_of(client, session_id)))
    workflow_id = next(
        e["data"]["workflow_id"]
        for e in log_of(client, session_id)
        if e["kind"] == "workflow_started"
    )
    assert client.cancel_turn(session_id) is True
    assert client.wait_for_workflow(workflow_id, timeout=10)["status"] == "cancelled"
    client.wait_for_idle(session_id, timeout=30)
    time.sleep(3.5)  # the step's late result, discarded: no second finish
    found = log_of(client, session_id)
    tail = kinds(found)[kinds(found).index("turn_cancelled") :]
    assert tail == ["turn_cancelled", "reply", "workflow_finished", "phase_committed"]
    assert [e["data"] for e in found if e["kind"] == "workflow_finished"] == [
        {"workflow_id": workflow_id, "status": "cancelled"}
    ]


# -- reading: bad input and other users ----------------------------------------------


def test_another_users_session_reads_as_unknown(client: AgentClient) -> None:
    session_id, owner = uid("s"), uid("u")
    client.send_message(session_id, "hello", user_id=owner)
    client.wait_for_idle(session_id, timeout=30)
    assert log_of(client, session_id) == list(client.events(session_id, user_id=owner))
    for reader in (
        lambda: client.events(session_id, user_id="someone-else"),
        lambda: client.events(uid("s")),
        lambda: client.revisions(session_id, user_id="someone-else"),
        lambda: client.fork_session(session_id, 1, uid("s"), user_id="someone-else"),
    ):
        with pytest.raises(NotFoundError, match="unknown session"):
            reader()
    for bad in ({"after": -1}, {"after": "3"}, {"timeout": -1.0}):
        with pytest.raises(InvalidPayloadError):
            client.events(session_id, **bad)  # type: ignore[arg-type]


# -- time travel ---------------------------------------------------------------------


def test_every_revision_reads_as_get_session_showed_it_then(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    shown = []
    for text in ("what is 2+3?", "what is 2+3 and 4*5?", "?!?", "what is 9*9?"):
        client.send_message(session_id, text, user_id=user)
        shown.append(client.wait_for_idle(session_id, timeout=60))
    for doc in shown:
        assert client.get_session(session_id, revision=doc["revision"]) == doc
    listed = client.revisions(session_id)
    mid = next(r for r in listed if r["phase"] == "executing")
    past = client.get_session(session_id, revision=mid["revision"])
    assert past is not None
    assert past["phase"] == "executing" and past["revision"] == mid["revision"]
    assert past["message_history"][-1]["role"] == "user"  # its turn had no answer yet
    assert past["message_history"] == shown[0]["message_history"][:1]
    assert client.get_session(session_id, revision=0)["message_history"] == []  # type: ignore[index]
    with pytest.raises(NotFoundError, match="no revision"):
        client.get_session(session_id, revision=shown[-1]["revision"] + 50)
    assert client.get_session(uid("s"), revision=1) is None


def test_a_fork_answers_its_own_messages_and_leaves_the_source_alone(
    client: AgentClient,
) -> None:
    source, user = uid("s"), uid("u")
    client.send_message(source, "what is 2+3?", user_id=user)
    first = client.wait_for_idle(source, timeout=30)
    client.send_message(source, "what is 4*5?", user_id=user)
    client.wait_for_idle(source, timeout=30)
    source_before = client.get_session(source)
    fork = client.fork_session(source, first["revision"], uid("f"))
    doc = client.get_session(fork)
    assert doc is not None
    assert doc["user_id"] == user and doc["phase"] == "idle" and doc["revision"] == 0
    assert doc["message_history"] == first["message_history"]
    assert log_of(client, fork) == [
        {
            "seq": 1,
            "kind": "forked",
            "revision": 0,
            "phase": "idle",
            "at": log_of(client, fork)[0]["at"],
            "data": {"source_session_id": source, "source_revision": first["revision"]},
        }
    ]
    client.send_message(fork, "what is 6*7?", user_id=user)
    doc = client.wait_for_idle(fork, timeout=30)
    assert [m["content"] for m in doc["message_history"]] == [
        "what is 2+3?",
        "2+3 = 5",
        "what is 6*7?",
        "6*7 = 42",
    ]
    assert [e["seq"] for e in log_of(client, fork)] == list(range(1, len(log_of(client, fork)) + 1))
    assert client.get_session(source) == source_before
    # A fork of a mid-turn revision rests too, and goes on from there.
    mid = next(r for r in client.revisions(source) if r["phase"] == "planning")
    other = client.fork_session(source, mid["revision"], uid("f"))
    client.send_message(other, "what is 1+1?", user_id=user)
    assert client.wait_for_idle(other, timeout=30)["message_history"][-1]["content"] == "1+1 = 2"
    with pytest.raises(SessionExistsError):
        client.fork_session(source, 0, fork)


# -- retention -----------------------------------------------------------------------


def test_beat_prunes_old_events_and_revisions_but_keeps_the_current_state(
    client: AgentClient, events_settings: Settings
) -> None:
    schedule = celery_config(events_settings)["beat_schedule"]
    assert {"task": schedule["agentstate-prune-events"]["task"]} == {"task": PRUNE_TASK}
    assert isinstance(prune_events, AgentStateTask)
    session_id, user = uid("s"), uid("u")
    for text in ("what is 2+3?", "what is 4*5?"):
        client.send_message(session_id, text, user_id=user)
        current = client.wait_for_idle(session_id, timeout=30)
    engine = get_engine(events_settings.database_url)
    old = utcnow() - timedelta(days=events_settings.events_retain_days + 1)
    with engine.begin() as conn:
        for table in (events, revisions):
            conn.execute(update(table).where(table.c.session_id == session_id).values(at=old))
    make_app(events_settings).send_task(PRUNE_TASK, queue=events_settings.queue)

    def pruned() -> bool:
        with engine.connect() as conn:
            left = conn.execute(
                select(func.count()).where(events.c.session_id == session_id)
            ).scalar_one()
        return int(left) == 0

    wait_until(pruned)
    assert client.get_session(session_id) == current
    assert client.get_session(session_id, revision=current["revision"]) == current
    # Revision 0 (the newest whole record older than the cutoff) is the base the rest
    # need: it and everything after it stay readable.
    kept = [r["revision"] for r in client.revisions(session_id)]
    assert kept == list(range(current["revision"] + 1))
    client.send_message(session_id, "what is 6*7?", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    assert log_of(client, session_id)[0]["kind"] == "message_accepted"


# -- the README's examples -----------------------------------------------------------


@pytest.mark.parametrize("example", ["follow_events.py", "time_travel.py"])
def test_the_readme_examples_run(
    client: AgentClient, events_settings: Settings, example: str
) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / example)],
        cwd=REPO,
        env=settings_env(events_settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    if example == "follow_events.py":
        assert "message_accepted" in result.stdout and "'text': '6*7 = 42'" in result.stdout
    else:
        assert result.stdout.strip().splitlines()[-1] == "10-4 = 6"
        assert "1 planning receive_input+intent_clear" in result.stdout


# -- the command line ----------------------------------------------------------------


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTSTATE, *args],
        cwd=REPO,
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_command_line_lists_shows_forks_and_prints_events(
    client: AgentClient, events_settings: Settings
) -> None:
    session_id, user, fork = uid("s"), uid("u"), uid("f")
    client.send_message(session_id, "what is 2+3?", user_id=user)
    first = client.wait_for_idle(session_id, timeout=30)
    client.send_message(session_id, "what is 4*5?", user_id=user)
    client.wait_for_idle(session_id, timeout=30)
    listed = _cli(events_settings, "session", "history", session_id, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == client.revisions(session_id)
    table = _cli(events_settings, "session", "history", session_id)
    assert "receive_input+intent_clear" in table.stdout
    shown = _cli(
        events_settings,
        "session",
        "show",
        session_id,
        "--revision",
        str(first["revision"]),
        "--json",
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == first
    printed = _cli(events_settings, "session", "events", session_id, "--json")
    assert json.loads(printed.stdout) == log_of(client, session_id)
    lines = _cli(events_settings, "session", "events", session_id, "--after", "3").stdout
    assert len(lines.strip().splitlines()) == len(log_of(client, session_id)) - 3
    made = _cli(
        events_settings, "session", "fork", session_id, "--at", str(first["revision"]), "--to", fork
    )
    assert made.returncode == 0 and made.stdout.strip() == fork, made.stderr
    assert client.get_session(fork)["message_history"] == first["message_history"]  # type: ignore[index]
    for args, words in (
        (("session", "history", uid("s")), "unknown session"),
        (("session", "events", uid("s")), "unknown session"),
        (("session", "show", session_id, "--revision", "999"), "no revision 999"),
        (("session", "show", session_id, "--revision", "-1"), "must be 0 or more"),
        (("session", "fork", session_id, "--at", "1", "--to", fork), "already exists"),
        (("session", "fork", session_id, "--to", uid("f")), "--at"),
    ):
        result = _cli(events_settings, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1, args
