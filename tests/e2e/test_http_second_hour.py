"""The HTTP API where a newcomer's requests went quietly wrong: a parameter a write does
not take is refused rather than ignored, a body that is not JSON says so, and the OpenAPI
document lists the erasure's 403. Against a real ``agentstate serve``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from config import Settings
from tasks.client import AgentClient
from tests.api_support import Api, new_keys, serving
from tests.support import make_settings, uid

SPEC = {"steps": [{"step_id": "a", "action": "echo", "inputs": {"x": 1}}]}


@pytest.fixture(scope="module")
def settings(pg_url: str) -> Settings:
    return make_settings(pg_url, queue=uid("q"))  # no workers: nothing here needs a turn


@pytest.fixture(scope="module")
def api(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with serving(settings, tmp_path_factory.mktemp("serve"), new_keys("alice", "*")) as running:
        yield running


def refused(answer: httpx.Response, status: int, *words: str) -> None:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["kind"] == "bad_input", body
    for word in words:
        assert word in body["error"], body


def test_a_users_key_cannot_start_a_workflow_for_someone_else(api: Api, settings: Settings) -> None:
    workflow_id = uid("wf")
    answer = api.client("alice").post(
        "/v1/workflows", params={"user_id": "bob"}, json={**SPEC, "workflow_id": workflow_id}
    )
    refused(answer, 400, "user_id", "operator")
    assert AgentClient(settings).get_workflow(workflow_id) is None
    # Its own name is no mistake, and the operator may name anyone.
    mine = api.client("alice").post("/v1/workflows", params={"user_id": "alice"}, json=SPEC)
    assert mine.status_code == 202, mine.text
    theirs = api.client("*").post("/v1/workflows", params={"user_id": "bob"}, json=SPEC)
    assert theirs.status_code == 202, theirs.text
    started = AgentClient(settings).get_workflow(theirs.json()["workflow_id"], user_id="bob")
    assert started is not None


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/sessions/{id}/messages", {"text": "hello", "user_id": "alice"}),
        ("POST", "/v1/workflows", SPEC),
        ("POST", "/v1/sessions/{id}/cancel", None),
    ],
)
def test_a_write_with_a_parameter_it_does_not_take_changes_nothing(
    api: Api, settings: Settings, method: str, path: str, body: object
) -> None:
    session_id = uid("s")  # the session's id, or the workflow's
    if isinstance(body, dict) and "steps" in body:
        body = {**body, "workflow_id": session_id}
    answer = api.client("alice").request(
        method, path.format(id=session_id), params={"dry_run": "true"}, json=body
    )
    refused(answer, 400, "unknown query parameter 'dry_run'")
    client = AgentClient(settings)
    assert client.get_session(session_id) is None and client.get_workflow(session_id) is None
    # A read ignores what it does not take (a cache-buster, a tracking tag).
    assert api.client("alice").get("/v1/me", params={"_": "1"}).status_code == 200


@pytest.mark.parametrize("content", [b"hello", b"{", b'{"text": "hi",}'])
def test_a_body_that_is_not_json_says_so(api: Api, content: bytes) -> None:
    answer = api.client("alice").post(
        f"/v1/sessions/{uid('s')}/messages",
        content=content,
        headers={"content-type": "application/json"},
    )
    refused(answer, 422, "the body is not valid JSON (")
    assert "JSON decode error" not in answer.text


def test_the_openapi_document_lists_the_erasures_403(api: Api) -> None:
    document = api.client("*").get("/openapi.json").json()
    responses = document["paths"]["/v1/users/{user_id}"]["delete"]["responses"]
    assert "403" in responses
    assert api.client("alice").delete("/v1/users/alice").status_code == 403
