"""Who decided, which ids are minted, and input that once answered 500 (issue 39), against
a real ``agentstate serve``: with a user's key an approval's ``by`` is that user; ``POST
/v1/sessions`` mints an id; a Unicode digit as Last-Event-ID, a cursor out of datetime's
range and a ``before_seq`` past the column's type answer 4xx or a page, never 5xx; a
database that does not answer is named without its host, port or driver text."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings
from tasks.client import AgentClient
from tasks.worker.processes import free_port
from tests.api_support import Api, new_keys, serving
from tests.support import make_settings, uid

ALICE, BOB = uid("alice"), uid("bob")
GATED = {"steps": [{"step_id": "gate", "action": "echo", "inputs": {}, "approval": True}]}


@pytest.fixture(scope="module")
def settings(pg_url: str) -> Settings:
    return make_settings(pg_url, queue=uid("q"))  # no workers: nothing here needs a turn


@pytest.fixture(scope="module")
def api(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    keys = new_keys(ALICE, BOB, "*")
    with serving(settings, tmp_path_factory.mktemp("identity"), keys) as running:
        yield running


def pending_approval(api: Api, user: str) -> str:
    started = api.client(user).post("/v1/workflows", json=GATED)
    assert started.status_code == 202, started.text
    workflow_id = started.json()["workflow_id"]
    found = api.client(user).get("/v1/approvals").json()
    return str(next(a["approval_id"] for a in found if a["workflow_id"] == workflow_id))


def test_a_users_key_decides_as_that_user(api: Api, settings: Settings) -> None:
    approval_id = pending_approval(api, ALICE)
    alice = api.client(ALICE)
    forged = alice.post(
        f"/v1/approvals/{approval_id}", json={"approve": True, "by": "security-team@corp.example"}
    )
    assert forged.status_code == 400, forged.text
    assert forged.json()["kind"] == "bad_input"
    undecided = AgentClient(settings).approvals(user_id=ALICE)
    assert any(a["approval_id"] == approval_id for a in undecided)  # nothing changed
    decided = alice.post(f"/v1/approvals/{approval_id}", json={"approve": False})
    assert decided.status_code == 200, decided.text
    assert decided.json()["by"] == ALICE


def test_the_operator_names_who_decided(api: Api) -> None:
    approval_id = pending_approval(api, BOB)
    operator = api.client("*")
    assert operator.post(f"/v1/approvals/{approval_id}", json={"approve": True}).status_code == 400
    decided = operator.post(
        f"/v1/approvals/{approval_id}", json={"approve": True, "by": "ops@example.com"}
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["by"] == "ops@example.com"


def test_a_session_id_is_minted_for_its_caller(api: Api) -> None:
    alice = api.client(ALICE)
    made = alice.post("/v1/sessions")
    assert made.status_code == 201, made.text
    session_id = made.json()["session_id"]
    assert alice.get(f"/v1/sessions/{session_id}").json()["user_id"] == ALICE
    assert api.client(BOB).get(f"/v1/sessions/{session_id}").status_code == 404
    sent = alice.post(f"/v1/sessions/{session_id}/messages", json={"text": "hi", "user_id": ALICE})
    assert sent.status_code == 202, sent.text
    assert alice.post("/v1/sessions").json()["session_id"] != session_id
    assert alice.post("/v1/sessions", json={"user_id": BOB}).status_code == 404
    operator = api.client("*")
    assert operator.post("/v1/sessions").status_code == 400  # whose?
    theirs = operator.post("/v1/sessions", json={"user_id": BOB})
    assert theirs.status_code == 201
    assert api.client(BOB).get(f"/v1/sessions/{theirs.json()['session_id']}").status_code == 200


def cursor(moment: str, item_id: str) -> str:
    raw = json.dumps([moment, item_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "bad",
    [
        cursor("0001-01-01T00:00:00+05:00", "x"),
        cursor("9999-12-31T23:59:59-05:00", "x"),
        cursor("2026-01-01T00:00:00+00:00", "nul\u0000"),
        cursor("2026-01-01T00:00:00+00:00", 7),  # type: ignore[arg-type]
    ],
)
def test_an_impossible_cursor_never_answers_5xx(api: Api, bad: str) -> None:
    for path in ("/v1/sessions", "/v1/workflows"):
        answer = api.client(ALICE).get(path, params={"cursor": bad})
        # Refused, or a moment before every row (an empty page): never a server error.
        assert answer.status_code in (200, 400), answer.text


def test_sequence_numbers_at_the_edge_of_their_types_never_answer_5xx(api: Api) -> None:
    alice = api.client(ALICE)
    session_id = alice.post("/v1/sessions").json()["session_id"]
    for before in (2**31 - 1, 2**31, 15448490976, 2**63 - 1):
        answer = alice.get(f"/v1/sessions/{session_id}", params={"before_seq": before})
        assert answer.status_code == 200, (before, answer.text)
    # '²' in latin-1, as servers decode header bytes: a digit to str.isdigit, not to int.
    for header in (b"\xb2", "\u0663".encode(), b"1" * 30, b"-1", b""):
        with alice.stream(
            "GET",
            f"/v1/sessions/{session_id}/events",
            params={"timeout": 0.3},
            headers={"Last-Event-ID": header},
        ) as answer:
            assert answer.status_code == 200, header
            answer.read()


def test_a_database_that_does_not_answer_is_not_described(pg_url: str, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: the database is down for this server
    down = make_settings(pg_url.rsplit("@", 1)[0] + f"@127.0.0.1:{port}/nowhere", queue=uid("q"))
    keys = new_keys(ALICE)
    with serving(down, tmp_path, keys) as api:
        answer = api.client(ALICE).get(f"/v1/sessions/{uid('s')}")
        assert answer.status_code == 503, answer.text
        body = answer.text
        for leak in ("127.0.0.1", str(port), "port", "nowhere", "psycopg", "SELECT", "server at"):
            assert leak not in body, body
