"""AG-UI 1.0 at ``POST /agui/{agent}`` on a real ``agentstate serve`` and real workers, every
event parsed by the ``ag-ui-protocol`` package's own models: a run with its steps and
streamed text, an approval as an interrupt resumed (approved, then rejected) without a new
turn, a retried request, and what is refused before the stream begins (no key, another
user's thread, an unknown agent, a body that is not a RunAgentInput), changing nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import Event, EventType, RunAgentInput, UserMessage
from pydantic import TypeAdapter

from config import Settings
from tasks.client import AgentClient
from tests.api_support import Api, new_keys, serving
from tests.support import Workers, make_settings, uid

pytestmark = pytest.mark.workers

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


@pytest.fixture(scope="module")
def worker_settings(pg_url: str) -> Settings:
    """The reference agent as ``default``, and a second agent, ``shout``."""
    return make_settings(
        pg_url,
        queue=uid("q"),
        stuck_after=30.0,
        retry_backoff=0.05,
        agents="shout=examples.shout_agent,testing=tests.agents",
    )


@pytest.fixture(scope="module")
def api(
    workers: Workers, worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    keys = new_keys("alice", "bob", "*")
    with serving(worker_settings, tmp_path_factory.mktemp("serve"), keys) as running:
        yield running


@pytest.fixture(scope="module")
def agent(worker_settings: Settings) -> AgentClient:
    return AgentClient(worker_settings)


def run_input(thread: str, text: str | None = None, **more: Any) -> dict[str, Any]:
    messages = [] if text is None else [UserMessage(id=str(uuid.uuid4()), content=text)]
    made = RunAgentInput(
        thread_id=thread,
        run_id=str(uuid.uuid4()),
        messages=messages,
        state={},
        tools=[],
        context=[],
        forwarded_props={},
        **more,
    )
    body: dict[str, Any] = made.model_dump(mode="json", by_alias=True)
    return body


def run(client: httpx.Client, body: dict[str, Any], agent: str = "default") -> list[Any]:
    """The run's events, each parsed by the ag-ui-protocol models."""
    found = []
    with client.stream("POST", f"/agui/{agent}", json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data:"):
                found.append(EVENTS.validate_python(json.loads(line[5:])))
    return found


def types(events: list[Any]) -> list[str]:
    return [str(event.type.value) for event in events]


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)


def check_shape(events: list[Any]) -> None:
    """RUN_STARTED first, RUN_FINISHED (or RUN_ERROR) last, steps paired, at most one text
    message, the snapshots just before the end."""
    kinds = types(events)
    assert kinds[0] == "RUN_STARTED" and kinds[-1] in ("RUN_FINISHED", "RUN_ERROR"), kinds
    assert events[0].protocol_version == "1.0"
    assert kinds[-3:-1] == ["STATE_SNAPSHOT", "MESSAGES_SNAPSHOT"], kinds
    open_steps: list[str] = []
    for event in events:
        if event.type == EventType.STEP_STARTED:
            assert not open_steps, kinds
            open_steps.append(event.step_name)
        elif event.type == EventType.STEP_FINISHED:
            assert open_steps == [event.step_name], kinds
            open_steps.pop()
    assert not open_steps
    assert kinds.count("TEXT_MESSAGE_START") <= 1 and kinds.count("TEXT_MESSAGE_END") <= 1


def test_a_run_streams_steps_and_one_text_message(api: Api, agent: AgentClient) -> None:
    alice = api.client("alice")
    thread = uid("th")
    events = run(alice, run_input(thread, "what is 12*7?"))
    check_shape(events)
    kinds = types(events)
    assert kinds.count("TEXT_MESSAGE_START") == 1
    assert kinds.count("TEXT_MESSAGE_CONTENT") > 1  # the reference agent streams its reply
    steps = [e.step_name for e in events if e.type == EventType.STEP_STARTED]
    assert steps == [
        "understanding",
        "planning",
        "retrieving",
        "executing",
        "evaluating",
        "generating",
    ]
    start = next(e for e in events if e.type == EventType.TEXT_MESSAGE_START)
    stored = agent.get_session(thread)
    assert stored is not None and stored["user_id"] == "alice"
    reply = stored["message_history"][-1]["content"]
    assert text_of(events) == reply and "84" in reply
    snapshot = next(e for e in events if e.type == EventType.MESSAGES_SNAPSHOT)
    assert [m.role for m in snapshot.messages] == ["user", "assistant"]
    assert snapshot.messages[-1].id == start.message_id and snapshot.messages[-1].content == reply
    state = next(e for e in events if e.type == EventType.STATE_SNAPSHOT)
    assert state.snapshot["phase"] == "idle" and state.snapshot["session_id"] == thread
    assert events[-1].outcome.type == "success"
    assert events[-1].thread_id == thread


def test_an_approval_is_an_interrupt_that_the_next_run_resumes(
    api: Api, agent: AgentClient
) -> None:
    alice = api.client("alice")
    thread = uid("th")
    run(alice, run_input(thread, "remember that the sky is green"))
    asked = run(alice, run_input(thread, "forget everything"))
    check_shape(asked)
    assert "TEXT_MESSAGE_START" not in types(asked)
    outcome = asked[-1].outcome
    assert outcome.type == "interrupt" and len(outcome.interrupts) == 1
    # (Other modules' alices may have approvals of their own: this thread's only.)
    pending = [p for p in agent.approvals(user_id="alice") if p["session_id"] == thread]
    assert [p["approval_id"] for p in pending] == [outcome.interrupts[0].id]
    turns_before = _user_messages(agent, thread)

    resume = [
        {
            "interruptId": outcome.interrupts[0].id,
            "status": "resolved",
            "payload": {"approve": True, "note": "go"},
        }
    ]
    resumed = run(alice, run_input(thread, None, resume=resume))
    check_shape(resumed)
    assert resumed[-1].outcome.type == "success"
    assert "forgotten" in text_of(resumed)
    assert next(e.step_name for e in resumed if e.type == EventType.STEP_STARTED) == "executing"
    assert _user_messages(agent, thread) == turns_before  # a resume starts no new turn
    decided = [
        d for d in agent.approvals(user_id="alice", pending=False) if d["session_id"] == thread
    ]
    assert decided[0]["by"] == "alice" and decided[0]["note"] == "go"

    run(alice, run_input(thread, "remember that water is wet"))
    again = run(alice, run_input(thread, "forget everything"))
    interrupt = again[-1].outcome.interrupts[0]
    cancel = [{"interruptId": interrupt.id, "status": "cancelled"}]
    rejected = run(alice, run_input(thread, None, resume=cancel))
    assert rejected[-1].outcome.type == "success"
    assert "kept" in text_of(rejected).lower()
    assert [p for p in agent.approvals(user_id="alice") if p["session_id"] == thread] == []
    # The same interrupt again: decided already, refused before any stream.
    answer = alice.post("/agui/default", json=run_input(thread, None, resume=cancel))
    assert answer.status_code == 404, answer.text


def test_each_agent_of_the_deployment_has_its_door(api: Api, agent: AgentClient) -> None:
    alice = api.client("alice")
    thread = uid("th")
    shouted = run(alice, run_input(thread, "hello there"), agent="shout")
    check_shape(shouted)
    assert "HELLO THERE" in text_of(shouted)
    # A thread keeps the agent of its first run: another agent's door refuses it.
    refused = alice.post("/agui/default", json=run_input(thread, "and now?"))
    assert refused.status_code == 400 and "shout" in refused.json()["error"], refused.text
    assert _user_messages(agent, thread) == 1


def test_a_run_cancelled_from_another_door_finishes_cancelled(api: Api) -> None:
    alice, other = api.client("alice"), api.client("alice")
    thread = uid("th")
    found = []
    body = run_input(thread, "trickle and stall")
    with alice.stream("POST", "/agui/testing", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            event = EVENTS.validate_python(json.loads(line[5:]))
            found.append(event)
            deltas = sum(e.type == EventType.TEXT_MESSAGE_CONTENT for e in found)
            if event.type == EventType.TEXT_MESSAGE_CONTENT and deltas == 2:
                # The reply is being written: cancel the turn from /v1.
                cancelled = other.post(f"/v1/sessions/{thread}/cancel")
                assert cancelled.json() == {"cancelled": True}, cancelled.text
    check_shape(found)
    assert found[-1].outcome.type == "cancelled"
    assert types(found).count("TEXT_MESSAGE_END") == 1
    snapshot = next(e for e in found if e.type == EventType.MESSAGES_SNAPSHOT)
    assert snapshot.messages[-1].content.startswith("Cancelled")


def _user_messages(agent: AgentClient, thread: str) -> int:
    doc = agent.get_session(thread)
    assert doc is not None
    return sum(item["role"] == "user" for item in doc["message_history"])


def test_a_retried_request_starts_no_second_turn(api: Api, agent: AgentClient) -> None:
    alice = api.client("alice")
    thread = uid("th")
    body = run_input(thread, "what is 6*7?")
    first = run(alice, body)
    second = run(alice, {**body, "runId": str(uuid.uuid4())})
    assert "42" in text_of(first)
    assert types(second)[-1] == "RUN_FINISHED"
    assert _user_messages(agent, thread) == 1


def test_what_is_refused_before_the_stream_changes_nothing(api: Api, agent: AgentClient) -> None:
    alice, bob, nobody = api.client("alice"), api.client("bob"), api.client()
    thread = uid("th")
    run(alice, run_input(thread, "hello there"))
    before = agent.get_session(thread)
    refusals = [
        (nobody.post("/agui/default", json=run_input(thread, "hi")), 401),
        (bob.post("/agui/default", json=run_input(thread, "hi")), 404),
        (alice.post("/agui/nobody-here", json=run_input(thread, "hi")), 404),
        (alice.post("/agui/default", json={"threadId": thread}), 400),
        (alice.post("/agui/default", content=b"{not json"), 400),
        (alice.post("/agui/default", json=run_input(thread, None)), 400),
        (alice.post("/agui/default", json=run_input("bad id!", "hi")), 400),
        (alice.post("/agui/default", json=run_input(thread, None, resume=[])), 400),
    ]
    for answer, status in refusals:
        assert answer.status_code == status, answer.text
        assert set(answer.json()) == {"error", "kind"}
    bob_resume = [{"interruptId": "apr-x", "status": "resolved", "payload": {"approve": True}}]
    assert (
        bob.post("/agui/default", json=run_input(thread, None, resume=bob_resume)).status_code
        == 404
    )
    assert agent.get_session(thread) == before


# -- the official JavaScript client -------------------------------------------------------

CLIENT_JS = Path(__file__).resolve().parent / "agui_js"


@pytest.fixture(scope="module")
def http_agent() -> Path:
    """@ag-ui/client installed as its lock file pins it (npm ci, once per checkout)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed to test with @ag-ui/client"
    if not (CLIENT_JS / "node_modules" / "@ag-ui" / "client").is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=CLIENT_JS,
            check=True,
            timeout=300,
        )
    return CLIENT_JS / "run.mjs"


def test_the_official_http_agent_runs_and_resumes(
    api: Api, agent: AgentClient, http_agent: Path
) -> None:
    thread = uid("th")
    done = subprocess.run(
        ["node", str(http_agent), f"{api.url}/agui/default", api.keys["alice"], thread],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    plain = seen["plain"]
    assert plain["types"][0] == "RUN_STARTED" and plain["types"][-1] == "RUN_FINISHED"
    assert plain["types"].count("TEXT_MESSAGE_START") == 1
    assert "84" in plain["deltas"] and plain["last"] == {
        "role": "assistant",
        "content": plain["deltas"],
    }
    assert plain["finished"]["outcome"] == "success"
    asked = seen["asked"]
    assert asked["finished"]["outcome"] == "interrupt"
    assert seen["pending"] == asked["finished"]["interrupts"] and len(seen["pending"]) == 1
    resumed = seen["resumed"]
    assert resumed["finished"]["outcome"] == "success" and "forgotten" in resumed["deltas"]
    stored = agent.get_session(thread)
    assert stored is not None
    history = [(m["role"], m["content"]) for m in stored["message_history"]]
    assert [(m["role"], m["content"]) for m in seen["messages"]] == history
    assert sum(role == "user" for role, _ in history) == 3  # the resume started no turn


def test_a_client_holding_the_state_gets_a_json_patch(api: Api, agent: AgentClient) -> None:
    """A run sent with the state the client holds ends with a ``STATE_DELTA`` when the
    patch is smaller than the snapshot: a retried run (no new turn) against the last
    snapshot is an empty patch; a new turn changes most of the session, so a snapshot."""
    import jsonpatch

    from tasks.server.protocols.agui.projection import state_of

    alice = api.client("alice")
    thread = uid("thread")
    body = run_input(thread, "what is 2+3?")
    first = run(alice, body)
    held = next(e for e in first if e.type == EventType.STATE_SNAPSHOT).snapshot
    again = run(alice, {**body, "state": held})
    kinds = types(again)
    assert "STATE_SNAPSHOT" not in kinds and kinds[-3:-1] == ["STATE_DELTA", "MESSAGES_SNAPSHOT"]
    (delta,) = [e for e in again if e.type == EventType.STATE_DELTA]
    stored = state_of(agent.get_session(thread, user_id="alice", history_limit=0) or {})
    assert jsonpatch.apply_patch(held, delta.delta) == json.loads(json.dumps(stored))
    later = run(alice, {**run_input(thread, "and 4+4?"), "state": held})
    assert "STATE_SNAPSHOT" in types(later)  # the patch would be the larger
