"""A sender need not import the action modules: it validates against what workers serve."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator

import pytest

from config import Settings
from state.errors import UnknownActionError
from tasks.actions import known_actions
from tasks.client import AgentClient
from tests.support import Workers, make_settings, uid

pytestmark = pytest.mark.workers

MODULE = f"served_only_{uid('m').replace('-', '_')}"
ACTION_MODULE = """
from tasks.actions import action


@action("reverse")
def reverse(inputs, deps, context):
    return {"text": inputs["text"][::-1]}
"""


@pytest.fixture(scope="module")
def worker_settings(pg_url: str) -> Settings:
    return make_settings(pg_url, queue=uid("q"), action_modules=MODULE)


@pytest.fixture(scope="module")
def workers(
    worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workers]:
    # The module lives in a folder on the worker's PYTHONPATH only, not on this process's.
    folder = tmp_path_factory.mktemp("served_only")
    (folder / f"{MODULE}.py").write_text(ACTION_MODULE)
    pool = Workers(worker_settings, tmp_path_factory.mktemp("workers"), count=1)
    pool.env["PYTHONPATH"] = f"{folder}:{pool.env['PYTHONPATH']}"
    yield pool.start()
    pool.stop()


@pytest.fixture(scope="module")
def client(worker_settings: Settings, workers: Workers) -> AgentClient:
    # The sender's own settings name no action module (it could not import this one).
    return AgentClient(make_settings(worker_settings.database_url, queue=worker_settings.queue))


def test_an_action_only_the_workers_know_can_be_started(client: AgentClient) -> None:
    assert importlib.util.find_spec(MODULE) is None and MODULE not in sys.modules
    assert "reverse" not in known_actions([])
    spec = {"steps": [{"step_id": "r", "action": "reverse", "inputs": {"text": "stressed"}}]}
    doc = client.wait_for_workflow(client.start_workflow(spec), timeout=60)
    assert doc["status"] == "success"
    assert doc["steps"]["r"]["outputs"] == {"text": "desserts"}


def test_an_action_nobody_serves_is_still_refused(client: AgentClient, workers: Workers) -> None:
    workflow_id = uid("wf")
    spec = {"workflow_id": workflow_id, "steps": [{"step_id": "r", "action": "reverse_all"}]}
    with pytest.raises(UnknownActionError, match="unknown action 'reverse_all'"):
        client.start_workflow(spec)
    assert client.get_workflow(workflow_id) is None
