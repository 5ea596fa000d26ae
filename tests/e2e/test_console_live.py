"""The console, live: a reply that streams in as it is produced, a turn cancelled and a
workflow cancelled and retried from the page, a running workflow's steps in dependency
order, sessions listed by the time the column shows, and a user's key deciding as its
user. In a real headless Chromium against a real ``agentstate serve`` and real workers
running the test agent (its "trickle" replies stream, its "risky" turns ask for approval).
"""

from __future__ import annotations

from typing import Any

import pytest

from config import Settings
from tasks.client import AgentClient
from tests.api_support import Api, replied, wait_for
from tests.e2e import test_console as console
from tests.e2e.test_console import shot, sign_in, talk
from tests.support import agent_test_settings, uid

pytestmark = [pytest.mark.workers, pytest.mark.browser]

# A step that waits an hour on its durable timer: its workflow runs, holding no worker.
LATER = {"action": "echo", "inputs": {}, "not_before_s": 3600}


# The console tests' browser, page and service, over workers of this module's own.
chromium, page, api = console.chromium, console.page, console.api


@pytest.fixture(scope="module")
def worker_settings(pg_url: str) -> Settings:
    return agent_test_settings(pg_url)


def ask(api: Api, user: str, session_id: str, text: str) -> None:
    answer = api.client(user).post(
        f"/v1/sessions/{session_id}/messages", json={"text": text, "user_id": user}
    )
    assert answer.status_code == 202, answer.text


def test_the_reply_streams_in_as_it_is_produced(page: Any, api: Api, tmp_path: Any) -> None:
    session_id = talk(api, "alice", "hello")
    sign_in(page, api, "alice", f"#/sessions/{session_id}")
    page.locator("#conversation .message.assistant").first.wait_for()
    # Twelve chunks, with a two-second stall halfway: the page shows the reply growing.
    ask(api, "alice", session_id, "trickle, stall please")
    page.wait_for_function(
        """() => {
            const live = document.querySelector('#live-reply .text');
            return live && live.textContent.includes('part 1 ')
                && !live.textContent.includes('part 12');
        }"""
    )
    shot(page, "streaming", tmp_path)
    assert page.locator("#conversation .message.assistant").count() == 2  # the live one too
    whole = " ".join(f"part {n}" for n in range(1, 13))
    page.locator("#conversation .message.assistant .text", has_text=whole).wait_for()
    page.locator("#live-reply").wait_for(state="detached")
    assert page.locator("#conversation .message.assistant").count() == 2


def test_a_running_turn_is_cancelled_from_the_page(page: Any, api: Api) -> None:
    session_id = uid("c-alice")
    ask(api, "alice", session_id, "risky business")  # it waits for a person's approval
    sign_in(page, api, "alice", f"#/sessions/{session_id}")
    page.locator("#session-phase", has_text="awaiting_approval").wait_for()
    page.get_by_role("button", name="Cancel turn").click()
    page.locator("#session-phase", has_text="idle").wait_for()
    assert page.locator("#cancel-turn").is_hidden()
    doc = replied(api.client("alice"), session_id)
    assert doc is not None
    assert doc["message_history"][-1]["metadata"]["kind"] == "cancelled"


def test_a_workflow_is_cancelled_and_retried_from_the_page(page: Any, api: Api) -> None:
    spec = {"steps": [{"step_id": "a", "action": "echo", "inputs": {}}, {"step_id": "b", **LATER}]}
    client = api.client("alice")
    workflow_id = client.post("/v1/workflows", json=spec).json()["workflow_id"]
    sign_in(page, api, "alice", f"#/workflows/{workflow_id}")
    page.locator("#workflow-status", has_text="running").wait_for()
    assert page.locator("#retry-workflow").count() == 0
    page.get_by_role("button", name="Cancel workflow").click()
    page.locator("#workflow-status", has_text="cancelled").wait_for()
    assert client.get(f"/v1/workflows/{workflow_id}").json()["steps"]["b"]["error"] == "cancelled"
    page.get_by_role("button", name="Retry workflow").click()
    page.locator("#workflow-status", has_text="running").wait_for()
    doc = client.get(f"/v1/workflows/{workflow_id}").json()
    assert doc["status"] == "running" and doc["steps"]["b"]["status"] == "pending"
    client.post(f"/v1/workflows/{workflow_id}/cancel")


def test_a_running_workflows_steps_are_listed_in_dependency_order(page: Any, api: Api) -> None:
    # Listed in the spec against their order, ids against it too: the table must not care.
    spec = {
        "steps": [
            {"step_id": "a-last", "action": "echo", "dependencies": ["m-middle"]},
            {"step_id": "m-middle", "action": "echo", "dependencies": ["z-first"]},
            {"step_id": "b-side", "action": "echo", "dependencies": ["z-first"]},
            {"step_id": "z-first", **LATER},
            {"step_id": "c-alone", "action": "echo"},
        ]
    }
    client = api.client("alice")
    workflow_id = client.post("/v1/workflows", json=spec).json()["workflow_id"]
    sign_in(page, api, "alice", f"#/workflows/{workflow_id}")
    rows = page.locator("#workflow-steps tbody tr")
    rows.first.wait_for()
    order = [row.get_attribute("data-step") for row in rows.all()]
    assert order == ["c-alone", "z-first", "b-side", "m-middle", "a-last"]
    page.reload()
    page.locator("#workflow-steps tbody tr").first.wait_for()
    again = [row.get_attribute("data-step") for row in rows.all()]
    assert again == order  # the same at every refresh
    client.post(f"/v1/workflows/{workflow_id}/cancel")


def test_sessions_are_listed_newest_first_by_the_time_they_show(
    page: Any, api: Api, worker_settings: Settings
) -> None:
    user = uid("lister")
    client = AgentClient(worker_settings)
    made = []
    for n in range(3):
        session_id = uid(f"s{n}")
        client.send_message(session_id, "hello", user_id=user)
        client.wait_for_idle(session_id, timeout=60)
        made.append(session_id)
    # The oldest changes last: by the time of its last change it would be first.
    client.send_message(made[0], "hello again", user_id=user)
    client.wait_for_idle(made[0], timeout=60)
    sign_in(page, api, "*")
    page.get_by_label("User").fill(user)
    page.get_by_role("button", name="Search").click()
    page.wait_for_function("document.querySelectorAll('#session-results tbody tr').length === 3")
    listed = page.locator("#session-results tbody td:first-child").all_inner_texts()
    assert listed == made[::-1]  # newest first
    headers = page.locator("#session-results thead th").all_inner_texts()
    shown = page.locator("#session-results tbody td:last-child time").evaluate_all(
        "els => els.map(el => el.getAttribute('datetime'))"
    )
    assert headers[-1] == "Created" and len(shown) == 3
    assert shown == sorted(shown, reverse=True)


def test_a_users_key_decides_as_its_user(page: Any, api: Api) -> None:
    session_id = uid("c-alice")
    ask(api, "alice", session_id, "risky business")
    client = api.client("alice")

    def asked() -> list[Any] | None:
        mine = [a for a in client.get("/v1/approvals").json() if a["session_id"] == session_id]
        return mine or None

    approval = wait_for(asked, what="the approval request")[0]
    sign_in(page, api, "alice", "#/approvals")
    field = page.get_by_label("Decide as")
    assert field.input_value() == "alice" and not field.is_editable()
    row = page.locator(f'tr[data-approval="{approval["approval_id"]}"]')
    row.get_by_role("button", name="Reject").click()
    row.wait_for(state="detached")
    decided = client.get("/v1/approvals", params={"pending": "false"}).json()
    mine = next(a for a in decided if a["approval_id"] == approval["approval_id"])
    assert mine["decision"] == "rejected" and mine["by"] == "alice"
