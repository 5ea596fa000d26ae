"""The console in a real headless Chromium (Debian's ``chromium``, driven by Playwright from
PyPI; no browser is ever downloaded), against a real ``agentstate serve`` and real
workers: search, a conversation with each turn's path, a DAG drawn with its statuses,
an approval granted from the page, and a reply appearing without a reload.

Each view's screenshot is written to the test's folder (and to
``AGENTSTATE_TEST_SCREENSHOTS`` when set), to look at.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from config import Settings
from tests.api_support import Api, new_keys, replied, serving, wait_for
from tests.infra import ensure_program
from tests.support import Workers, uid

pytestmark = [pytest.mark.workers, pytest.mark.browser]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 800}
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    program = ensure_program("chromium", "chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=program, args=CHROMIUM_ARGS, headless=True
        )
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def api(
    workers: Workers, worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    keys = new_keys("alice", "bob", "*")
    with serving(worker_settings, tmp_path_factory.mktemp("serve"), keys) as running:
        yield running


@pytest.fixture
def page(chromium: Any, api: Api) -> Iterator[Any]:
    # Playwright evaluates its waits as strings, which the console's CSP forbids.
    context = chromium.new_context(viewport=VIEWPORT, bypass_csp=True)
    opened = context.new_page()
    opened.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert not errors, f"errors in the page: {errors}"


def sign_in(page: Any, api: Api, user: str, view: str = "#/sessions") -> None:
    page.goto(f"{api.url}/{view}")
    page.get_by_label("API key").fill(api.keys[user])
    page.get_by_role("button", name="Use key").click()
    page.locator("#whoami").filter(has_text="operator" if user == "*" else user).wait_for()


def shot(page: Any, name: str, folder: Path) -> Path:
    path = folder / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("AGENTSTATE_TEST_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / path.name)
    fits = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert fits, f"{name}: wider than the {VIEWPORT['width']}px window"
    return path


def talk(api: Api, user: str, text: str, replies: int = 1) -> str:
    client = api.client("*")
    session_id = uid(f"c-{user}")
    answer = client.post(
        f"/v1/sessions/{session_id}/messages", json={"text": text, "user_id": user}
    )
    assert answer.status_code == 202, answer.text
    wait_for(lambda: replied(client, session_id, replies), what="the reply")
    return session_id


def test_search_finds_a_users_sessions(page: Any, api: Api, tmp_path: Path) -> None:
    user, other = uid("searcher"), uid("other")
    mine = [talk(api, user, "what is 1+2?"), talk(api, user, "hello")]
    theirs = talk(api, other, "hello")
    sign_in(page, api, "*")
    page.get_by_label("User").fill(user)
    page.get_by_role("button", name="Search").click()
    rows = page.locator("#session-results tbody tr")
    rows.first.wait_for()
    page.wait_for_function("document.querySelectorAll('#session-results tbody tr').length === 2")
    listed = rows.locator("td:first-child").all_inner_texts()
    assert sorted(listed) == sorted(mine) and theirs not in listed
    shot(page, "sessions", tmp_path)
    rows.first.get_by_role("link").click()
    page.locator("#conversation .message").first.wait_for()
    assert page.url.endswith(f"#/sessions/{listed[0]}")


def test_a_conversation_shows_each_turns_path_through_the_machine(
    page: Any, api: Api, tmp_path: Path
) -> None:
    session_id = talk(api, "alice", "what is 12*7?")
    api.client("alice").post(
        f"/v1/sessions/{session_id}/messages", json={"text": "?!", "user_id": "alice"}
    )
    wait_for(lambda: replied(api.client("alice"), session_id, 2), what="the clarification")
    sign_in(page, api, "alice", f"#/sessions/{session_id}")
    replies = page.locator("#conversation .message.assistant")
    page.wait_for_function("document.querySelectorAll('#conversation ol.path').length === 2")
    first = replies.nth(0).locator("ol.path li").all_inner_texts()
    assert first == [
        "idle",
        "understanding",
        "planning",
        "retrieving",
        "executing",
        "evaluating",
        "generating",
        "idle",
    ]
    assert "84" in replies.nth(0).locator(".text").inner_text()
    second = replies.nth(1).locator("ol.path li").all_inner_texts()
    assert second == ["idle", "understanding", "clarifying"]
    shot(page, "conversation", tmp_path)


def test_a_new_reply_appears_without_a_reload(page: Any, api: Api, tmp_path: Path) -> None:
    session_id = talk(api, "bob", "what is 2+2?")
    sign_in(page, api, "bob", f"#/sessions/{session_id}")
    page.locator("#conversation .message.assistant").first.wait_for()
    page.evaluate("window.__same_page = true")
    page.get_by_label("Message as bob").fill("what is 9*9?")
    page.get_by_role("button", name="Send").click()
    page.locator("#conversation .message.assistant .text", has_text="81").wait_for()
    # And one sent by someone else (another tab, another program) shows up the same way.
    api.client("bob").post(
        f"/v1/sessions/{session_id}/messages", json={"text": "what is 7*7?", "user_id": "bob"}
    )
    page.locator("#conversation .message.assistant .text", has_text="49").wait_for()
    assert page.evaluate("window.__same_page") is True
    assert page.locator("#conversation .message.assistant").count() == 3
    shot(page, "live-reply", tmp_path)


def test_a_workflow_dag_is_drawn_with_its_step_statuses(
    page: Any, api: Api, tmp_path: Path
) -> None:
    steps = [
        {"step_id": "fetch", "action": "calculate", "inputs": {"expression": "2+3"}},
        {
            "step_id": "left",
            "action": "calculate",
            "inputs": {"expression": "fetch*2"},
            "dependencies": ["fetch"],
        },
        {
            "step_id": "right",
            "action": "fail",
            "inputs": {"message": "on purpose"},
            "dependencies": ["fetch"],
            "max_retries": 0,
        },
        {"step_id": "join", "action": "echo", "dependencies": ["left", "right"]},
        {"step_id": "side", "action": "echo"},
    ]
    client = api.client("alice")
    workflow_id = client.post("/v1/workflows", json={"steps": steps}).json()["workflow_id"]

    def finished() -> dict[str, Any] | None:
        doc: dict[str, Any] = client.get(f"/v1/workflows/{workflow_id}").json()
        return doc if doc["status"] != "running" else None

    doc = finished() or wait_for(finished, what="the workflow")
    sign_in(page, api, "alice", f"#/workflows/{workflow_id}")
    page.locator("#workflow-status", has_text="failed").wait_for()
    nodes = page.locator("svg.dag g.node")
    assert nodes.count() == len(steps)
    drawn = {
        nodes.nth(i).get_attribute("data-step"): nodes.nth(i).get_attribute("data-status")
        for i in range(nodes.count())
    }
    assert drawn == {sid: step["status"] for sid, step in doc["steps"].items()}
    assert drawn["right"] == "failed" and drawn["join"] == "skipped"
    assert drawn["left"] == "success"
    edges = {
        (edge.get_attribute("data-from"), edge.get_attribute("data-to"))
        for edge in page.locator("svg.dag path.edge").all()
    }
    assert edges == {("fetch", "left"), ("fetch", "right"), ("left", "join"), ("right", "join")}
    x = {sid: node_x(page, sid) for sid in drawn}
    assert x["fetch"] == x["side"] < x["left"] == x["right"] < x["join"]
    shot(page, "dag", tmp_path)


def node_x(page: Any, step_id: str) -> float:
    transform = page.locator(f'svg.dag g.node[data-step="{step_id}"]').get_attribute("transform")
    return float(transform.split("(")[1].split()[0])


def test_an_approval_granted_from_the_page_lets_the_turn_go_on(
    page: Any, api: Api, tmp_path: Path
) -> None:
    client = api.client("alice")
    session_id = uid("forget")
    client.post(
        f"/v1/sessions/{session_id}/messages",
        json={"text": "forget everything", "user_id": "alice"},
    )

    def asked() -> list[Any] | None:
        mine = [a for a in client.get("/v1/approvals").json() if a["session_id"] == session_id]
        return mine or None

    approval = wait_for(asked, what="the approval request")[0]
    sign_in(page, api, "alice", "#/approvals")
    row = page.locator(f'tr[data-approval="{approval["approval_id"]}"]')
    row.wait_for()
    shot(page, "approvals", tmp_path)
    row.get_by_role("button", name="Approve").click()
    row.wait_for(state="detached")
    decided = client.get("/v1/approvals", params={"pending": "false"}).json()
    mine = next(a for a in decided if a["approval_id"] == approval["approval_id"])
    assert mine["decision"] == "approved" and mine["by"] == "alice"  # the key's user
    page.goto(f"{api.url}/#/sessions/{session_id}")
    page.locator("#session-phase", has_text="idle").wait_for()
    reply = page.locator("#conversation .message.assistant .text").last.inner_text()
    assert reply and "forg" in reply.lower()
    path = page.locator("#conversation .message.assistant ol.path").last
    path.wait_for()
    phases = path.locator("li").all_inner_texts()
    assert phases[phases.index("awaiting_approval") + 1] == "executing", phases
    assert phases[-1] == "idle"
    shot(page, "approved-turn", tmp_path)


def test_a_users_key_sees_only_that_users_sessions(page: Any, api: Api) -> None:
    theirs = talk(api, "bob", "hello")
    mine = talk(api, "alice", "hello")
    sign_in(page, api, "alice")
    page.get_by_role("button", name="Search").click()
    page.locator("#session-results tbody tr").first.wait_for()
    users = set(page.locator("#session-results tbody td:nth-child(2)").all_inner_texts())
    assert users == {"alice"}
    page.goto(f"{api.url}/#/sessions/{theirs}")
    page.get_by_role("alert").wait_for()
    assert "unknown session" in page.get_by_role("alert").inner_text()
    assert mine


def test_schedules_show_their_next_ticks(page: Any, api: Api, tmp_path: Path) -> None:
    schedule_id = uid("nightly")
    made = api.client("alice").post(
        "/v1/schedules",
        json={"schedule_id": schedule_id, "cron": "0 2 * * *", "session_id": uid("s"), "text": "x"},
    )
    assert made.status_code == 201, made.text
    sign_in(page, api, "alice", "#/schedules")
    row = page.locator("#schedules tbody tr").filter(has_text=schedule_id)
    row.wait_for()
    assert "0 2 * * *" in row.inner_text()
    shot(page, "schedules", tmp_path)


def test_every_field_has_a_label_and_the_page_its_landmarks(page: Any, api: Api) -> None:
    sign_in(page, api, "*")
    page.locator("#session-results").wait_for()
    unlabeled = page.evaluate(
        """[...document.querySelectorAll('input, select, textarea')]
             .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label'))
             .map(el => el.id || el.name)"""
    )
    assert unlabeled == []
    assert page.locator("main").count() == 1 and page.locator("nav").count() == 1
    headers = httpx.get(f"{api.url}/").headers
    assert "default-src 'self'" in headers["content-security-policy"]
