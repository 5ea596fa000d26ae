"""A2A push notifications on a real ``agentstate serve``, real workers and a real beat,
driven by the official ``a2a-sdk`` client: a task's config set, read, listed and deleted;
the task's changes delivered through the webhook outbox to a local receiver, signed (the
Standard Webhooks library verifies them) and carrying the config's token; another task of
the same context not delivered; another user's task reading as missing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError
from sqlalchemy import func, select

from config import Settings
from state.errors import ConfigurationError
from state.storage.tables_automation import deliveries, webhooks
from state.webhooks.hooks import new_secret
from tasks.client import AgentClient
from tasks.server.protocols.a2a.routes import card
from tests.api_support import Api, new_keys, serving
from tests.e2e.test_a2a import connect, message, run, send
from tests.services import Beat
from tests.support import Workers, agent_test_settings, uid
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def worker_settings(pg_url: str) -> Settings:
    return agent_test_settings(
        pg_url,
        webhook_allow_private=True,
        webhook_retry_base_seconds=0.05,
        webhook_timeout=5.0,
        tick_interval=0.2,
    )


@pytest.fixture(scope="module")
def api(
    workers: Workers, worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    log_dir: Path = tmp_path_factory.mktemp("push")
    beat = Beat(worker_settings, log_dir).start()
    keys = new_keys("alice", "bob", "*")
    with serving(worker_settings, log_dir, keys) as running:
        yield running
    beat.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver().start()
    yield running
    running.stop()


def wait_for(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("not seen in time")


def test_the_card_says_push_and_names_the_public_url(api: Api, worker_settings: Settings) -> None:
    async def resolve() -> pb.AgentCard:
        async with httpx.AsyncClient() as http:
            return await A2ACardResolver(http, f"{api.url}/a2a/default").get_agent_card()

    served = run(resolve())
    assert served.capabilities.push_notifications
    assert served.supported_interfaces[0].url == f"{api.url}/a2a/default"  # no public URL
    public = worker_settings.model_copy(update={"public_url": "https://agents.example.com/"})
    made = card(public, "default", "http://10.0.0.7:8000/", "1")
    assert made.supported_interfaces[0].url == "https://agents.example.com/a2a/default"
    with pytest.raises(ConfigurationError, match="AGENTSTATE_PUBLIC_URL"):
        Settings(public_url="agents.example.com")


def test_a_tasks_changes_are_pushed_signed_with_its_token(
    api: Api, receiver: Receiver, worker_settings: Settings
) -> None:
    secret = new_secret()
    receiver.secret = secret
    context = uid("ctx")

    async def go() -> tuple[pb.Task, list[pb.TaskPushNotificationConfig], Any]:
        client = await connect(api, "alice", streaming=False)
        (asked,) = await send(client, message("forget everything", context=context))
        task = asked.task
        assert task.status.state == pb.TASK_STATE_INPUT_REQUIRED
        config = pb.TaskPushNotificationConfig(
            task_id=task.id, id="mine", url=receiver.url, token="tok-123"
        )
        config.authentication.scheme = "whsec"
        config.authentication.credentials = secret
        made = await client.create_task_push_notification_config(config)
        other = pb.TaskPushNotificationConfig(task_id=task.id, id="spare", url=receiver.url)
        await client.create_task_push_notification_config(other)
        got = await client.get_task_push_notification_config(
            pb.GetTaskPushNotificationConfigRequest(task_id=task.id, id="mine")
        )
        listed = await client.list_task_push_notification_configs(
            pb.ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        await client.delete_task_push_notification_config(
            pb.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="spare")
        )
        after = await client.list_task_push_notification_configs(
            pb.ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        missing = None
        try:
            await client.get_task_push_notification_config(
                pb.GetTaskPushNotificationConfigRequest(task_id=task.id, id="spare")
            )
        except A2AError as exc:
            missing = exc
        assert made.id == "mine" and got.token == "tok-123" and got.url == receiver.url
        assert not got.authentication.credentials  # never given back
        assert [c.id for c in listed.configs] == ["mine", "spare"]
        assert [c.id for c in after.configs] == ["mine"]
        assert missing is not None
        (done,) = await send(client, message(context=context, task=task.id, approve=True))
        # The next task of the same context: the config is the first task's only.
        (nxt,) = await send(client, message("what is 2+2?", context=context))
        assert nxt.task.id != task.id
        return done.task, list(after.configs), nxt.task

    done, _, _ = run(go())
    assert done.status.state == pb.TASK_STATE_COMPLETED
    states = wait_for(
        lambda: (
            [
                r.verified["statusUpdate"]["status"]["state"]
                for r in receiver
                if isinstance(r.verified, dict) and r.answered == 200
            ]
            if len(receiver.ids()) >= 2
            else None
        )
    )
    # Two deliveries, sent by whichever workers take them: in either order.
    assert sorted(states) == ["TASK_STATE_COMPLETED", "TASK_STATE_WORKING"]
    for received in receiver:
        assert isinstance(received.verified, dict), received.verified  # signature verified
        assert received.headers["x-a2a-notification-token"] == "tok-123"
        update = received.verified["statusUpdate"]
        assert update["taskId"] == done.id and update["contextId"] == context
    # Written in the transaction of each change: the next task's reply wrote none.
    engine = AgentClient(worker_settings).backend.engine
    with engine.connect() as conn:
        hook = conn.execute(
            select(webhooks.c.webhook_id).where(webhooks.c.a2a_task == done.id)
        ).scalar_one()
        count = conn.execute(
            select(func.count()).select_from(deliveries).where(deliveries.c.webhook_id == hook)
        ).scalar_one()
    assert count == 2


def test_another_users_task_has_no_configs_for_them(api: Api, receiver: Receiver) -> None:
    async def go() -> list[str]:
        alice = await connect(api, "alice", streaming=False)
        (answer,) = await send(alice, message("hello"))
        task_id = answer.task.id
        bob = await connect(api, "bob", streaming=False)
        errors = []
        for call in (
            bob.create_task_push_notification_config(
                pb.TaskPushNotificationConfig(task_id=task_id, url=receiver.url)
            ),
            bob.list_task_push_notification_configs(
                pb.ListTaskPushNotificationConfigsRequest(task_id=task_id)
            ),
        ):
            try:
                await call
            except A2AError as exc:
                errors.append(type(exc).__name__)
        bad = None
        try:
            await alice.create_task_push_notification_config(
                pb.TaskPushNotificationConfig(task_id=task_id, url="ftp://nowhere")
            )
        except A2AError as exc:
            bad = type(exc).__name__
        errors.append(str(bad))
        return errors

    assert run(go()) == ["TaskNotFoundError", "TaskNotFoundError", "InvalidParamsError"]
