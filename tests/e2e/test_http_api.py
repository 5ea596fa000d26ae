"""The HTTP API against a real ``agentstate serve`` (uvicorn, its own process) and real
workers: keys (401), isolation between users' keys (404, for reads and writes),
idempotency, Server-Sent Events resumed with Last-Event-ID, workflows, approvals,
erasure, and bad input (4xx, nothing stored, never a 5xx)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from config import Settings
from state.documents import codec
from state.migrate import CURRENT_VERSION
from state.storage.db import get_engine
from state.storage.tables import sessions
from tasks.client import AgentClient
from tests.api_support import Api, follow, new_keys, replied, serving, wait_for
from tests.support import Workers, uid

pytestmark = pytest.mark.workers

JSON = {"content-type": "application/json"}


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


def send(client: httpx.Client, session_id: str, text: str, user: str, **headers: str) -> str:
    answer = client.post(
        f"/v1/sessions/{session_id}/messages", json={"text": text, "user_id": user}, headers=headers
    )
    assert answer.status_code == 202, answer.text
    message_id: str = answer.json()["message_id"]
    return message_id


def error(answer: httpx.Response, status: int, kind: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error", "kind"} and body["kind"] == kind, body
    assert "\n" not in body["error"]
    text: str = body["error"]
    return text


def operations(api: Api) -> list[tuple[str, str]]:
    """Every /v1 operation of the OpenAPI document, path parameters filled in."""
    document = api.client().get("/openapi.json").json()
    found = []
    for path, item in document["paths"].items():
        if path.startswith("/v1/"):
            concrete = path.replace("{", "").replace("}", "")  # {session_id} -> session_id
            found += [(method.upper(), concrete) for method in item]
    return found


# -- health and keys -----------------------------------------------------------------


def test_health_readiness_and_the_document_need_no_key(api: Api) -> None:
    anyone = api.client()
    assert anyone.get("/healthz").json()["status"] == "ok"
    ready = anyone.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "redis": "ok"}
    document = anyone.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert "/v1/sessions/{session_id}/messages" in document["paths"]


def test_every_v1_route_answers_401_without_a_valid_key(api: Api) -> None:
    ops = operations(api)
    assert len(ops) >= 15
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"}):
        anyone = api.client(**headers)
        for method, path in ops:
            answer = anyone.request(method, path, json={"text": "x", "user_id": "alice"})
            error(answer, 401, "unauthorized")
            assert answer.headers["www-authenticate"] == "Bearer", (method, path)
    # A key is whole: a prefix or a longer string is not it.
    key = api.keys["alice"]
    for almost in (key[:-1], key + "x", key.upper()):
        error(api.client(Authorization=f"Bearer {almost}").get("/v1/me"), 401, "unauthorized")
    assert api.client("alice").get("/v1/me").json() == {"user_id": "alice", "operator": False}
    assert api.client("*").get("/v1/me").json() == {"user_id": None, "operator": True}


def test_keys_never_reach_the_log(api: Api) -> None:
    api.client("alice").get("/v1/sessions")
    api.client(Authorization="Bearer not-a-key-but-long-enough").get("/v1/sessions")
    log = api.log.read_text(errors="replace")
    assert "GET /v1/sessions" in log  # the access log is there
    for key in api.keys.values():
        assert key not in log


# -- conversations ------------------------------------------------------------------------


def test_a_message_is_accepted_then_answered(api: Api) -> None:
    alice = api.client("alice")
    session_id = uid("http")
    message_id = send(alice, session_id, "what is 6*7?", "alice")
    doc = wait_for(lambda: replied(alice, session_id), what="the reply")
    assert doc["user_id"] == "alice"
    assert [m["role"] for m in doc["message_history"]] == ["user", "assistant"]
    assert doc["message_history"][0]["metadata"]["message_id"] == message_id
    assert "42" in doc["message_history"][1]["content"]
    assert doc["metadata"]["turn"]["path"][:2] == ["idle", "understanding"]
    page = alice.get(f"/v1/sessions/{session_id}", params={"history_limit": 1}).json()
    assert [m["role"] for m in page["message_history"]] == ["assistant"]
    revisions = alice.get(f"/v1/sessions/{session_id}/revisions").json()
    assert revisions[0]["trigger"] == "created" and revisions[-1]["phase"] == "idle"
    then = alice.get(f"/v1/sessions/{session_id}", params={"revision": 0}).json()
    assert then["revision"] == 0 and then["message_history"] == []
    listed = alice.get("/v1/sessions", params={"user_id": "alice", "limit": 1000}).json()
    assert session_id in {item["session_id"] for item in listed["items"]}


def test_another_users_session_reads_exactly_as_an_unknown_one(
    api: Api, agent: AgentClient
) -> None:
    alice, bob = api.client("alice"), api.client("bob")
    session_id, unknown = uid("mine"), uid("none")
    send(alice, session_id, "what is 1+1?", "alice")
    wait_for(lambda: replied(alice, session_id), what="the reply")
    for path in ("", "/revisions", "/events"):
        theirs = bob.get(f"/v1/sessions/{session_id}{path}")
        nothing = bob.get(f"/v1/sessions/{unknown}{path}")
        assert error(theirs, 404, "not_found") == f"unknown session {session_id!r}"
        assert error(nothing, 404, "not_found") == f"unknown session {unknown!r}"
    listed = bob.get("/v1/sessions", params={"limit": 1000}).json()["items"]
    assert session_id not in {item["session_id"] for item in listed}
    assert all(item["user_id"] == "bob" for item in listed)
    assert bob.get("/v1/sessions", params={"user_id": "alice"}).json()["items"] == []
    # Writing to it: as bob, or claiming to be alice, answers as an unknown session does.
    before = agent.get_session(session_id)
    for user in ("bob", "alice"):
        answer = bob.post(
            f"/v1/sessions/{session_id}/messages", json={"text": "mine now", "user_id": user}
        )
        assert error(answer, 404, "not_found") == f"unknown session {session_id!r}"
    after = agent.get_session(session_id)
    assert after is not None and before is not None
    assert after["message_history"] == before["message_history"] and after["queued"] == 0
    # The operator sees every user's.
    assert api.client("*").get(f"/v1/sessions/{session_id}").status_code == 200


def test_writes_to_another_users_objects_answer_404_and_change_nothing(
    api: Api, agent: AgentClient
) -> None:
    alice, bob = api.client("alice"), api.client("bob")
    session_id = uid("w")
    send(alice, session_id, "forget everything", "alice")
    approval = wait_for(lambda: alice.get("/v1/approvals").json() or None, what="approval")[0]
    started = alice.post(
        "/v1/workflows",
        # A durable timer keeps it running without holding a worker (a sleep would).
        json={"steps": [{"step_id": "a", "action": "echo", "not_before_s": 3600}]},
    )
    workflow_id = started.json()["workflow_id"]
    error(bob.post(f"/v1/sessions/{session_id}/cancel"), 404, "not_found")
    error(bob.post(f"/v1/workflows/{workflow_id}/cancel"), 404, "not_found")
    error(bob.post(f"/v1/workflows/{workflow_id}/retry"), 404, "not_found")
    error(bob.get(f"/v1/workflows/{workflow_id}"), 404, "not_found")
    decided = bob.post(
        f"/v1/approvals/{approval['approval_id']}", json={"approve": True, "by": "bob"}
    )
    error(decided, 404, "not_found")
    spec = {"session_id": session_id, "steps": [{"step_id": "a", "action": "echo"}]}
    assert 400 <= bob.post("/v1/workflows", json=spec).status_code < 500
    assert bob.get("/v1/approvals").json() == []
    assert workflow_id not in {w["workflow_id"] for w in bob.get("/v1/workflows").json()["items"]}
    # Nothing changed: the turn still waits, the approval is undecided, the workflow runs.
    assert agent.get_session(session_id)["phase"] == "awaiting_approval"  # type: ignore[index]
    assert agent.approvals(user_id="alice")[0]["decision"] is None
    assert agent.get_workflow(workflow_id)["status"] == "running"  # type: ignore[index]
    alice.post(f"/v1/workflows/{workflow_id}/cancel")


def test_one_idempotency_key_makes_one_message_and_one_turn(api: Api) -> None:
    alice = api.client("alice")
    session_id, key = uid("idem"), uid("key")
    ids = [send(alice, session_id, "what is 2+2?", "alice", **{"Idempotency-Key": key})]
    ids += [send(alice, session_id, "what is 2+2?", "alice", **{"Idempotency-Key": key})]
    assert ids[0] == ids[1]
    other = alice.post(
        f"/v1/sessions/{session_id}/messages",
        json={"text": "what is 3+3?", "user_id": "alice"},
        headers={"Idempotency-Key": key},
    )
    error(other, 409, "conflict")
    doc = wait_for(lambda: replied(alice, session_id), what="the reply")
    assert [m["content"] for m in doc["message_history"] if m["role"] == "user"] == ["what is 2+2?"]
    assert sum(m["role"] == "assistant" for m in doc["message_history"]) == 1


# -- events --------------------------------------------------------------------------


def test_events_stream_and_resume_with_last_event_id(api: Api) -> None:
    alice = api.client("alice")
    session_id = uid("sse")
    send(alice, session_id, "what is 5*5?", "alice")
    first = follow(alice, session_id, lambda e: e["kind"] == "reply")
    seqs = [int(m.id) for m in first if m.id is not None]
    assert seqs == list(range(1, len(seqs) + 1))  # gap-free, each once, from 1
    assert all(m.data and m.data["seq"] == int(m.id or 0) for m in first)
    assert first[-1].data and "25" in first[-1].data["data"]["text"]
    # A follower that dropped out after seq 3 resumes with Last-Event-ID: nothing lost
    # or repeated, the second turn's events follow.
    got: list[Any] = []
    answered: list[int] = []

    def turn_over(event: dict[str, Any]) -> bool:  # the second reply, then its last commit
        if event["kind"] == "reply" and "36" in event["data"]["text"]:
            answered.append(event["seq"])
        return bool(answered) and event["kind"] == "phase_committed" and event["phase"] == "idle"

    reader = threading.Thread(
        target=lambda: got.extend(
            follow(alice, session_id, turn_over, headers={"Last-Event-ID": "3"})
        )
    )
    reader.start()
    send(alice, session_id, "what is 6*6?", "alice")
    reader.join(60)
    resumed = [int(m.id) for m in got if m.id is not None]
    assert resumed[: len(seqs) - 3] == seqs[3:]
    assert resumed == list(range(4, resumed[-1] + 1))
    # ?after= does the same without the header; ?timeout= ends a stream by itself.
    with alice.stream(
        "GET", f"/v1/sessions/{session_id}/events", params={"after": resumed[-1], "timeout": 1}
    ) as quiet:
        assert quiet.status_code == 200
        assert "id:" not in quiet.read().decode()


# -- workflows -----------------------------------------------------------------------


def test_workflows_start_read_cancel_and_retry(api: Api) -> None:
    alice = api.client("alice")
    spec = {
        "workflow_id": uid("wf"),
        "steps": [
            {"step_id": "a", "action": "calculate", "inputs": {"expression": "2+3"}},
            # Waits on a durable timer: running, without holding a worker.
            {"step_id": "b", "action": "echo", "not_before_s": 3600, "dependencies": ["a"]},
        ],
    }
    started = alice.post("/v1/workflows", json=spec)
    assert started.status_code == 202 and started.json()["workflow_id"] == spec["workflow_id"]
    workflow_id = spec["workflow_id"]
    again = alice.post("/v1/workflows", json=spec)
    assert again.status_code == 202 and again.json()["workflow_id"] == workflow_id
    other = {**spec, "steps": spec["steps"][:1]}
    error(alice.post("/v1/workflows", json=other), 409, "conflict")
    wait_for(
        lambda: (
            alice.get(f"/v1/workflows/{workflow_id}").json()["steps"]["a"]["status"] == "success"
            or None
        ),
        what="step a",
    )
    cancelled = alice.post(f"/v1/workflows/{workflow_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    doc = cancelled.json()
    assert doc["status"] == "cancelled" and doc["steps"]["b"]["status"] == "skipped"
    assert doc["steps"]["a"]["outputs"] == {"value": 5}
    error(alice.post(f"/v1/workflows/{workflow_id}/cancel"), 409, "conflict")
    retried = alice.post(f"/v1/workflows/{workflow_id}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "running"
    assert retried.json()["steps"]["a"]["status"] == "success"
    error(alice.post(f"/v1/workflows/{workflow_id}/retry"), 409, "conflict")
    alice.post(f"/v1/workflows/{workflow_id}/cancel")
    listed = api.client("*").get("/v1/workflows", params={"status": "cancelled"}).json()
    assert workflow_id in {item["workflow_id"] for item in listed["items"]}
    error(alice.get(f"/v1/workflows/{uid('none')}"), 404, "not_found")


# -- approvals -----------------------------------------------------------------------


def test_an_approval_is_decided_once_over_http_and_the_turn_goes_on(api: Api) -> None:
    alice, bob = api.client("alice"), api.client("bob")
    session_id = uid("appr")
    send(alice, session_id, "forget everything", "alice")

    def waiting() -> dict[str, Any] | None:
        mine = [a for a in alice.get("/v1/approvals").json() if a["session_id"] == session_id]
        return mine[0] if mine else None

    approval = wait_for(waiting, what="the approval request")
    assert approval["action"] == "forget_memories" and approval["decision"] is None
    assert session_id not in {a["session_id"] for a in bob.get("/v1/approvals").json()}
    path = f"/v1/approvals/{approval['approval_id']}"
    # With a user's key the decision is that user's: another name is refused.
    forged = alice.post(path, json={"approve": True, "by": "security-team@corp.example"})
    error(forged, 400, "bad_input")
    decided = alice.post(path, json={"approve": True, "note": "ok"})
    assert decided.status_code == 200, decided.text
    assert decided.json()["decision"] == "approved" and decided.json()["by"] == "alice"
    second = api.client("*").post(path, json={"approve": False, "by": "someone else"})
    assert "alice" in error(second, 409, "conflict")
    doc = wait_for(lambda: replied(alice, session_id), what="the reply after the approval")
    assert doc["phase"] == "idle"
    history = alice.get("/v1/approvals", params={"pending": "false"}).json()
    assert approval["approval_id"] in {a["approval_id"] for a in history}


# -- erasure -------------------------------------------------------------------------


def test_erasure_is_for_the_operator_key_only(api: Api, agent: AgentClient) -> None:
    user = uid("gone")
    operator = api.client("*")
    session_id = uid("er")
    answer = operator.post(
        f"/v1/sessions/{session_id}/messages", json={"text": "remember that x", "user_id": user}
    )
    assert answer.status_code == 202
    wait_for(lambda: replied(operator, session_id), what="the reply")
    error(api.client("alice").delete(f"/v1/users/{user}"), 403, "forbidden")
    assert agent.get_session(session_id) is not None
    erased = operator.delete(f"/v1/users/{user}")
    assert erased.status_code == 200, erased.text
    counts = erased.json()
    assert counts and all(isinstance(n, int) for n in counts.values()) and sum(counts.values()) > 0
    error(operator.get(f"/v1/sessions/{session_id}"), 404, "not_found")
    again = operator.delete(f"/v1/users/{user}")
    assert again.status_code == 200 and sum(again.json().values()) == 0


# -- bad input -----------------------------------------------------------------------


def test_bad_input_is_a_4xx_and_stores_nothing(
    api: Api, agent: AgentClient, worker_settings: Settings
) -> None:
    operator = api.client("*")
    user, session_id = uid("bad"), uid("bad")
    message = f"/v1/sessions/{session_id}/messages"
    too_long = "x" * (worker_settings.max_message_bytes + 1)
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("POST", message, {"json": {"text": 5, "user_id": user}}, 422),
        ("POST", message, {"json": {"text": "hi"}}, 422),
        ("POST", message, {"json": {"text": "hi", "user_id": "no spaces"}}, 422),
        ("POST", message, {"json": {"text": "hi", "user_id": user, "extra": 1}}, 422),
        (
            "POST",
            message,
            {"json": {"text": "hi", "user_id": user, "multitask_strategy": "x"}},
            422,
        ),
        ("POST", message, {"json": [1, 2]}, 422),
        ("POST", message, {"content": b"{not json", "headers": JSON}, 422),
        ("POST", message, {"content": b'{"text": NaN, "user_id": "u"}', "headers": JSON}, 422),
        ("POST", message, {"json": {"text": too_long, "user_id": user}}, 413),
        ("POST", message, {"content": b"x" * (3 << 20), "headers": JSON}, 413),
        (
            "POST",
            message,
            {"json": {"text": "hi", "user_id": user}, "headers": {"Idempotency-Key": "k" * 300}},
            422,
        ),
        ("POST", "/v1/sessions/bad%20id/messages", {"json": {"text": "hi", "user_id": user}}, 422),
        ("POST", "/v1/workflows", {"json": {"session_id": session_id, "steps": []}}, 422),
        (
            "POST",
            "/v1/workflows",
            {"json": {"steps": [{"step_id": "a", "action": "nope"}]}, "params": {"user_id": user}},
            400,
        ),
        (
            "POST",
            "/v1/workflows",
            {
                "json": {
                    "steps": [
                        {"step_id": "a", "action": "echo", "dependencies": ["b"]},
                        {"step_id": "b", "action": "echo", "dependencies": ["a"]},
                    ]
                },
                "params": {"user_id": user},
            },
            400,
        ),
        (
            "POST",
            "/v1/workflows",
            {"json": {"steps": [{"step_id": "a", "action": "echo", "inptus": {}}]}},
            400,
        ),
        ("GET", "/v1/sessions", {"params": {"limit": 0}}, 422),
        ("GET", "/v1/sessions", {"params": {"cursor": "not-a-cursor"}}, 400),
        ("GET", "/v1/sessions", {"params": {"phase": "dancing"}}, 400),
        ("GET", f"/v1/sessions/{session_id}", {"params": {"history_limit": -1}}, 422),
        ("GET", "/v1/workflows", {"params": {"status": "sleeping"}}, 422),
        ("POST", "/v1/approvals/apr-x", {"json": {"approve": "yes", "by": "me"}}, 422),
        ("POST", "/v1/approvals/apr-x", {"json": {"approve": True, "by": ""}}, 422),
        ("POST", "/v1/approvals/apr-x", {"json": {"approve": True, "by": "expired"}}, 400),
        ("GET", "/v1/nothing-here", {}, 404),
        ("DELETE", f"/v1/sessions/{session_id}", {}, 405),
    ]
    for method, path, options, status in cases:
        answer = operator.request(method, path, **options)
        assert answer.status_code == status, (method, path, options.keys(), answer.text)
        body = answer.json()
        assert set(body) == {"error", "kind"} and "\n" not in body["error"], body
    assert agent.get_session(session_id) is None
    assert agent.list_sessions(user_id=user)["items"] == []
    assert all(w["session_id"] != session_id for w in agent.list_workflows(limit=1000)["items"])


def test_an_oversized_message_names_its_limit(api: Api, worker_settings: Settings) -> None:
    answer = api.client("alice").post(
        f"/v1/sessions/{uid('big')}/messages",
        json={"text": "x" * (worker_settings.max_message_bytes + 1), "user_id": "alice"},
    )
    assert "AGENTSTATE_MAX_MESSAGE_BYTES" in error(answer, 413, "bad_input")
    huge = api.client("alice").post(
        f"/v1/sessions/{uid('big')}/messages", content=b"{" * (3 << 20), headers=JSON
    )
    assert "AGENTSTATE_MAX_REQUEST_BYTES" in error(huge, 413, "bad_input")


def test_state_a_newer_version_stored_answers_409_and_is_left_as_it_is(
    api: Api, worker_settings: Settings
) -> None:
    # The schema-driven run found this as a 500: a session written by a newer agentstate.
    session_id = uid("future")
    raw = codec.dumps({"session_id": session_id, "_version": CURRENT_VERSION + 1, "new": 1})
    engine = get_engine(worker_settings.database_url)
    with engine.begin() as conn:
        conn.execute(
            sessions.insert().values(
                session_id=session_id,
                user_id="alice",
                doc=raw,
                created_at=func.now(),
                updated_at=func.now(),
            )
        )
    alice = api.client("alice")
    reads = [alice.get(f"/v1/sessions/{session_id}")]
    writes = [
        alice.post(
            f"/v1/sessions/{session_id}/messages",
            json={"text": "hello", "user_id": "alice", "multitask_strategy": strategy},
        )
        for strategy in ("reject", "interrupt", "rollback")
    ]
    for answer in reads + writes:
        assert "upgrade agentstate" in error(answer, 409, "conflict")
    # Queued without reading the session, as from the Python client: the newer workers of
    # a rolling upgrade answer it.
    send(alice, session_id, "hello", "alice")
    with engine.connect() as conn:
        stored = conn.execute(select(sessions.c.doc).where(sessions.c.session_id == session_id))
        assert codec.loads(stored.scalar_one()) == codec.loads(raw)
