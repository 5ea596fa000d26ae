"""A2A push notification configs on the webhook outbox, on each backend: a config hears its
own task only (the triggers' task condition of migration 0028), its body is the A2A
``statusUpdate``, signed, with the config's token; set again it is replaced, removed it
takes its deliveries; it never shows among the user's webhooks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import delete, select

from config import Settings
from state.documents import codec
from state.errors import WebhookSpecError
from state.storage.db import read_connection
from state.storage.tables_automation import deliveries, webhooks
from state.webhooks.courier import Courier
from state.webhooks.hooks import new_secret
from state.webhooks.pushes import PushStore
from tasks.client import AgentClient
from tests.integration.test_turn_engine import drain, engine_for
from tests.support import make_settings, uid
from tests.webhook_receiver import Receiver


@pytest.fixture
def client(settings: Settings) -> Iterator[AgentClient]:
    made = AgentClient(
        make_settings(settings.database_url, webhook_allow_private=True, webhook_timeout=2.0)
    )
    with made.backend.engine.begin() as conn:
        conn.execute(delete(webhooks))
        conn.execute(delete(deliveries))
    yield made
    with made.backend.engine.begin() as conn:
        conn.execute(delete(webhooks))
        conn.execute(delete(deliveries))


def test_a_config_hears_its_task_only_as_a2a_status_updates(client: AgentClient) -> None:
    alice, session = uid("alice"), uid("s")
    engine, dispatcher = engine_for(client.settings)
    first = engine.services.inbox.accept(session, alice, "what is 6*7?")
    task = {"message_id": first.message_id, "session_id": session, "user_id": alice}
    store = PushStore(client.backend.engine)
    receiver = Receiver().start()
    try:
        secret = new_secret()
        receiver.secret = secret
        store.put(task, "http://127.0.0.1:9/old", config_id="c1", allow_private=True)
        made = store.put(
            task,
            receiver.url,
            config_id="c1",
            token="tok",
            scheme="whsec",
            credentials=secret,
            allow_private=True,
        )
        assert made.url == receiver.url and [c.url for c in store.listing(first.message_id)] == [
            receiver.url
        ]
        dispatcher.phase("understanding", session, first.session_revision)
        drain(engine, dispatcher)
        second = engine.services.inbox.accept(session, alice, "and 7*8?")
        dispatcher.phase("understanding", session, second.session_revision)
        drain(engine, dispatcher)
        with read_connection(client.backend.engine) as conn:
            found = conn.execute(select(deliveries.c.event, deliveries.c.payload)).all()
        assert [row.event for row in found] == ["turn.completed"]
        body = codec.loads(found[0].payload) if isinstance(found[0].payload, str) else None
        assert body is None or body["data"]["message_id"] == first.message_id
        courier = Courier.build(client.backend.engine, client.settings)
        assert [courier.deliver(*due) for due in courier.due()] == ["delivered"]
        (got,) = list(receiver)
        assert isinstance(got.verified, dict), got.verified
        assert got.verified["statusUpdate"]["taskId"] == first.message_id
        assert got.verified["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert got.headers["x-a2a-notification-token"] == "tok"
        assert client.list_webhooks(user_id=alice) == [] and client.list_webhooks() == []
        assert store.remove(first.message_id, "c1") and not store.remove(first.message_id, "c1")
        with read_connection(client.backend.engine) as conn:
            assert conn.execute(select(deliveries.c.delivery_id)).all() == []
    finally:
        receiver.stop()


def test_bad_configs_store_nothing(client: AgentClient) -> None:
    task = {"message_id": uid("m"), "session_id": uid("s"), "user_id": uid("u")}
    store = PushStore(client.backend.engine)
    for bad in (
        {"url": "ftp://x"},
        {"url": "http://127.0.0.1:9/a", "scheme": "whsec", "credentials": "nope"},
        {"url": "http://127.0.0.1:9/a", "scheme": "Bearer"},
    ):
        with pytest.raises(WebhookSpecError):
            store.put(task, allow_private=True, **bad)  # type: ignore[arg-type]
    assert store.listing(str(task["message_id"])) == []
