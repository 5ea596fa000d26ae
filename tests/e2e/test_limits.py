"""No input costs more than its share, and reads are scoped: paged histories, bounded
user state and workflow specs, unreadable cache entries, reads by another user."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from config import Settings
from state.errors import (
    BadInputError,
    NotFoundError,
    WorkflowSessionNotFoundError,
    WorkflowSpecError,
)
from state.storage import keys
from state.storage.tables import steps, workflows
from tasks.cli.progress import WorkflowWatcher
from tasks.client import AgentClient
from tests.support import Workers, make_settings, uid

pytestmark = pytest.mark.workers

USER_STATE_LIMIT = 4096
SPEC_LIMIT = 20_000
LINK_LIMIT = 50
STEP_IO_LIMIT = 2048


@pytest.fixture(scope="module")
def limit_settings(pg_url: str) -> Settings:
    return make_settings(
        pg_url,
        queue=uid("q"),
        retry_backoff=0.05,
        action_modules="tests.actions_for_tests",
        max_user_state_bytes=USER_STATE_LIMIT,
        max_spec_bytes=SPEC_LIMIT,
        max_spec_links=LINK_LIMIT,
        max_step_io_bytes=STEP_IO_LIMIT,
    )


@pytest.fixture(scope="module")
def client(
    limit_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentClient]:
    pool = Workers(limit_settings, tmp_path_factory.mktemp("limits"), count=2).start()
    yield AgentClient(limit_settings)
    pool.stop()


def _ask(client: AgentClient, session_id: str, user: str, *texts: str) -> dict[str, Any]:
    for text in texts:
        client.send_message(session_id, text, user_id=user)
    return client.wait_for_idle(session_id, timeout=60)


def _stored_workflows(client: AgentClient) -> tuple[int, int]:
    with client.backend.engine.connect() as conn:
        return (
            conn.execute(select(func.count()).select_from(workflows)).scalar_one(),
            conn.execute(select(func.count()).select_from(steps)).scalar_one(),
        )


# -- item 5 of the issue: unbounded growth --------------------------------------------


def test_the_history_is_paged_newest_first_each_item_with_its_seq(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    _ask(client, session_id, user, "what is 1+1?", "what is 2+2?", "what is 3+3?")
    full = client.get_session(session_id)
    assert full is not None
    assert [m["seq"] for m in full["message_history"]] == [0, 1, 2, 3, 4, 5]
    contents = [m["content"] for m in full["message_history"]]
    page = client.get_session(session_id, history_limit=2)
    assert page is not None
    assert [m["seq"] for m in page["message_history"]] == [4, 5]
    assert [m["content"] for m in page["message_history"]] == contents[4:]
    older = client.get_session(session_id, history_limit=3, before_seq=4)
    assert older is not None
    assert [m["seq"] for m in older["message_history"]] == [1, 2, 3]
    assert [m["content"] for m in older["message_history"]] == contents[1:4]
    assert (
        client.get_session(session_id, before_seq=2)["message_history"]
        == (  # type: ignore[index]
            full["message_history"][:2]
        )
    )
    state_only = client.get_session(session_id, history_limit=0)
    assert state_only is not None and state_only["message_history"] == []
    assert state_only["phase"] == "idle" and state_only["revision"] == full["revision"]
    rested = client.wait_for_idle(session_id, timeout=5, history_limit=1)
    assert [m["seq"] for m in rested["message_history"]] == [5]


@pytest.mark.parametrize(
    "arguments",
    [
        {"history_limit": -1},
        {"history_limit": "10"},
        {"history_limit": True},
        {"history_limit": 1.5},
        {"before_seq": -1},
        {"before_seq": "3"},
    ],
)
def test_bad_paging_arguments_are_one_clear_error(
    client: AgentClient, arguments: dict[str, Any]
) -> None:
    name = next(iter(arguments))
    with pytest.raises(BadInputError, match=name):
        client.get_session(uid("s"), **arguments)


def test_a_page_costs_its_size_not_the_conversations(
    client: AgentClient, record_property: Callable[[str, object], None]
) -> None:
    session_id, user = uid("s"), uid("u")
    bulky = "word " * 12_000  # 60 kB, within AGENTSTATE_MAX_MESSAGE_BYTES
    for _ in range(15):
        _ask(client, session_id, user, bulky)
    full = json.dumps(client.get_session(session_id))
    page = json.dumps(client.get_session(session_id, history_limit=2))
    record_property("full_session_bytes", len(full))
    record_property("two_item_page_bytes", len(page))
    assert len(full) > 15 * len(bulky)
    # The newest message and its short reply, and the state (which holds the turn's
    # message once more): a few items' worth, not fifteen turns'.
    assert len(page) < 3 * len(bulky)


def test_user_state_over_the_limit_is_refused_and_changes_nothing(client: AgentClient) -> None:
    user = uid("u")
    client.save_user_state(user, {"notes": ["small"]})
    with pytest.raises(BadInputError, match="AGENTSTATE_MAX_USER_STATE_BYTES") as refused:
        client.save_user_state(user, {"notes": ["x" * USER_STATE_LIMIT]})
    assert str(USER_STATE_LIMIT) in str(refused.value)
    assert "\n" not in str(refused.value)
    assert client.load_user_state(user)["notes"] == ["small"]


def test_a_handler_growing_user_state_past_the_limit_gets_an_apology(client: AgentClient) -> None:
    session_id, user = uid("s"), uid("u")
    fact = "remember that " + "tea " * 450  # 1.8 kB: two fit in 4 kB, three do not
    doc = _ask(client, session_id, user, fact, fact.replace("tea", "oat"))
    assert [m["content"] for m in doc["message_history"]][1::2][-1].startswith("Got it")
    doc = _ask(client, session_id, user, fact.replace("tea", "rye"))
    last = doc["message_history"][-1]
    assert last["metadata"]["kind"] == "apology"
    assert "AGENTSTATE_MAX_USER_STATE_BYTES" in doc["metadata"]["last_error"]["detail"]
    memories = json.dumps(client.load_user_state(user))
    assert "tea" in memories and "oat" in memories and "rye" not in memories
    assert _ask(client, session_id, user, "what is 6*7?")["message_history"][-1]["content"] == (
        "6*7 = 42"
    )


# -- item 6: workflow spec limits -----------------------------------------------------


def _step(step_id: str, deps: list[str] | None = None, **inputs: Any) -> dict[str, Any]:
    return {"step_id": step_id, "action": "echo", "inputs": inputs, "dependencies": deps or []}


@pytest.mark.parametrize(
    ("spec", "limit"),
    [
        ({"steps": [_step("a", blob="x" * SPEC_LIMIT)]}, "AGENTSTATE_MAX_SPEC_BYTES"),
        (
            {"steps": [_step("a"), _step("b", blob="x" * STEP_IO_LIMIT)]},
            "AGENTSTATE_MAX_STEP_IO_BYTES",
        ),
        (
            {"steps": [_step(f"s{i}", [f"s{j}" for j in range(i)]) for i in range(11)]},
            "AGENTSTATE_MAX_SPEC_LINKS",
        ),
        (
            {"steps": [_step("a")], "context": {"blob": "x" * SPEC_LIMIT}},
            "AGENTSTATE_MAX_SPEC_BYTES",
        ),
    ],
    ids=["spec-bytes", "step-inputs", "links", "context"],
)
def test_specs_over_a_limit_are_refused_naming_it_and_store_nothing(
    client: AgentClient, spec: dict[str, Any], limit: str
) -> None:
    before = _stored_workflows(client)
    workflow_id = uid("wf")
    with pytest.raises(WorkflowSpecError, match=limit) as refused:
        client.start_workflow({**spec, "workflow_id": workflow_id})
    assert "\n" not in str(refused.value)
    assert _stored_workflows(client) == before
    assert client.get_workflow(workflow_id) is None


def test_an_oversized_step_output_fails_the_step_without_retries(client: AgentClient) -> None:
    spec = {
        "steps": [
            {
                "step_id": "big",
                "action": "sized_output",
                "inputs": {"bytes": STEP_IO_LIMIT + 1},
                "max_retries": 3,
            },
            {**_step("after", ["big"])},
            {
                "step_id": "fits",
                "action": "sized_output",
                "inputs": {"bytes": STEP_IO_LIMIT - 100},
            },
        ]
    }
    doc = client.wait_for_workflow(client.start_workflow(spec), timeout=60)
    big = doc["steps"]["big"]
    assert big["status"] == "failed" and big["retry_count"] == 0
    assert "AGENTSTATE_MAX_STEP_IO_BYTES" in big["error"] and not big["outputs"]
    assert doc["steps"]["after"]["status"] == "skipped"
    assert doc["steps"]["fits"]["status"] == "success"


class _Spy:
    """Counts the calls of one method of a real object, and passes them on."""

    def __init__(self, owner: Any, name: str) -> None:
        self.calls = 0
        real = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        setattr(owner, name, counted)


def _slow_workflow(client: AgentClient) -> str:
    sleep = {"step_id": "nap", "action": "sleep", "inputs": {"seconds": 1.0}}
    return client.start_workflow({"steps": [sleep, _step("a", ["nap"], blob="y" * 1000)]})


def test_waiting_for_a_workflow_reads_the_full_document_once(
    limit_settings: Settings,
) -> None:
    client = AgentClient(limit_settings)
    documents = _Spy(client.workflows.store, "document")
    doc = client.wait_for_workflow(_slow_workflow(client), timeout=60)
    assert doc["status"] == "success" and doc["steps"]["a"]["outputs"]["blob"] == "y" * 1000
    assert documents.calls == 1


def test_the_cli_progress_bar_reads_counts_until_the_end(limit_settings: Settings) -> None:
    client = AgentClient(limit_settings)
    documents = _Spy(client.workflows.store, "document")
    doc = WorkflowWatcher(client, _slow_workflow(client), quiet=True).wait(60)
    assert doc["status"] == "success"
    assert documents.calls == 1


# -- item 7: one unreadable cache entry -------------------------------------------------


@pytest.mark.parametrize(
    "plant",
    [["HSET", "rev", "garbage", "doc", "{}"], ["SET", "garbage"]],
    ids=["non-numeric-revision", "wrong-type"],
)
def test_an_unreadable_cache_entry_costs_no_lock_wait(
    client: AgentClient, limit_settings: Settings, plant: list[str]
) -> None:
    session_id, user = uid("s"), uid("u")
    r = redis.Redis.from_url(limit_settings.redis_url)
    r.execute_command(plant[0], keys.session_cache(session_id), *plant[1:])
    started = time.monotonic()
    client.send_message(session_id, "what is 2+2?", user_id=user)
    # Each phase used to wait out the lock TTL (30 s here): well under one TTL in all.
    doc = client.wait_for_idle(session_id, timeout=limit_settings.lock_timeout / 3)
    assert doc["message_history"][-1]["content"] == "2+2 = 4"
    assert time.monotonic() - started < limit_settings.lock_timeout / 3
    assert not r.exists(keys.session_lock(session_id))


# -- item 8: reads scoped by user -------------------------------------------------------


def test_another_users_session_reads_as_an_unknown_one(client: AgentClient) -> None:
    session_id, alice, mallory = uid("s"), uid("alice"), uid("mallory")
    _ask(client, session_id, alice, "what is 1+2?")
    mine = client.get_session(session_id, user_id=alice)
    assert mine is not None and mine["message_history"][-1]["content"] == "1+2 = 3"
    assert client.wait_for_idle(session_id, timeout=5, user_id=alice)["user_id"] == alice
    unknown = uid("s")
    assert client.get_session(session_id, user_id=mallory) is None
    assert client.get_session(unknown, user_id=mallory) is None
    for session in (session_id, unknown):
        with pytest.raises(NotFoundError, match=f"unknown session '{session}'"):
            client.wait_for_idle(session, timeout=1, user_id=mallory)
    with pytest.raises(BadInputError, match="invalid user id"):
        client.get_session(session_id, user_id="bad id")


def test_a_workflow_of_another_users_session_reads_as_an_unknown_one(
    client: AgentClient,
) -> None:
    session_id, alice, mallory = uid("s"), uid("alice"), uid("mallory")
    _ask(client, session_id, alice, "hello")
    spec = {"session_id": session_id, "steps": [_step("a", secret="alice's")]}
    workflow_id = client.start_workflow(spec)
    done = client.wait_for_workflow(workflow_id, timeout=60, user_id=alice)
    assert done["steps"]["a"]["outputs"] == {"secret": "alice's"}
    assert client.get_workflow(workflow_id, user_id=alice) == done
    assert client.get_workflow(workflow_id, user_id=mallory) is None
    with pytest.raises(NotFoundError, match=f"unknown workflow '{workflow_id}'"):
        client.wait_for_workflow(workflow_id, timeout=1, user_id=mallory)
    # A workflow of no session is its starter's: the operator's (nobody's) is no user's
    # to read, mallory's own is hers.
    loose = client.start_workflow({"steps": [_step("a")]})
    assert client.wait_for_workflow(loose, timeout=60)["status"] == "success"
    assert client.get_workflow(loose, user_id=mallory) is None
    own = client.start_workflow({"steps": [_step("a")]}, user_id=mallory)
    assert client.wait_for_workflow(own, timeout=60, user_id=mallory)["status"] == "success"
    # One that names a session that does not exist is refused, nothing stored.
    orphan = {"workflow_id": uid("wf"), "session_id": uid("s"), "steps": [_step("a")]}
    with pytest.raises(WorkflowSessionNotFoundError):
        client.start_workflow(orphan)
    assert client.get_workflow(orphan["workflow_id"]) is None
