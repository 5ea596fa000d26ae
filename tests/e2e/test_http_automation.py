"""``/v1/schedules`` and ``/v1/webhooks`` on a real ``agentstate serve``: scoped by the key's
user, bad input answered 400 with nothing stored, another user's objects 404."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config import Settings
from tests.api_support import Api, new_keys, serving
from tests.support import make_settings, uid


@pytest.fixture(scope="module")
def api(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    settings: Settings = make_settings(pg_url, queue=uid("q"))
    keys = new_keys("alice", "bob", "*")
    private = {"AGENTSTATE_WEBHOOK_ALLOW_PRIVATE": "true"}
    with serving(settings, tmp_path_factory.mktemp("serve"), keys, **private) as running:
        yield running


def test_schedules_over_http(api: Api) -> None:
    alice, bob, operator = api.client("alice"), api.client("bob"), api.client("*")
    body = {"cron": "0 9 * * 1-5", "timezone": "Europe/Paris", "session_id": uid("s"), "text": "hi"}
    made = alice.post("/v1/schedules", json=body)
    assert made.status_code == 201, made.text
    schedule = made.json()
    sid = schedule["schedule_id"]
    assert schedule["user_id"] == "alice" and schedule["next_tick"].endswith("Z")
    for bad, says in (
        ({**body, "cron": "0 9 * *"}, "five fields"),
        ({**body, "timezone": "Mars/Base"}, "unknown timezone"),
        ({**body, "every_seconds": 60}, "exactly one"),
    ):
        refused = alice.post("/v1/schedules", json={**bad, "schedule_id": "refused-one"})
        assert refused.status_code == 400 and says in refused.json()["error"], refused.text
    assert alice.get("/v1/schedules/refused-one").status_code == 404
    assert [s["schedule_id"] for s in alice.get("/v1/schedules").json()] == [sid]
    assert bob.get("/v1/schedules").json() == []
    assert bob.get(f"/v1/schedules/{sid}").status_code == 404
    assert bob.post(f"/v1/schedules/{sid}/pause").status_code == 404
    assert bob.delete(f"/v1/schedules/{sid}").status_code == 404
    assert alice.post(f"/v1/schedules/{sid}/pause").json()["paused"] is True
    assert alice.post(f"/v1/schedules/{sid}/resume").json()["paused"] is False
    assert alice.get(f"/v1/schedules/{sid}/runs").json() == []
    assert sid in {s["schedule_id"] for s in operator.get("/v1/schedules").json()}
    assert operator.post("/v1/schedules", json=body).status_code == 400  # as whom?
    assert alice.post("/v1/schedules", json={**body, "schedule_id": sid}).status_code == 201
    taken = alice.post("/v1/schedules", json={**body, "schedule_id": sid, "text": "other"})
    assert taken.status_code == 409
    assert alice.delete(f"/v1/schedules/{sid}").status_code == 204
    assert alice.get(f"/v1/schedules/{sid}").status_code == 404


def test_webhooks_over_http(api: Api) -> None:
    alice, bob = api.client("alice"), api.client("bob")
    made = alice.post(
        "/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "events": ["turn.completed"]}
    )
    assert made.status_code == 201, made.text
    hook = made.json()
    assert hook["secret"].startswith("whsec_") and hook["user_id"] == "alice"
    listed = alice.get("/v1/webhooks").json()
    assert [h["webhook_id"] for h in listed] == [hook["webhook_id"]]
    assert "secret" not in listed[0] or listed[0]["secret"] is None
    assert bob.get("/v1/webhooks").json() == []
    assert bob.get(f"/v1/webhooks/{hook['webhook_id']}/deliveries").status_code == 404
    assert alice.get(f"/v1/webhooks/{hook['webhook_id']}/deliveries").json() == []
    assert bob.post("/v1/webhooks/deliveries/msg_nothing/redeliver").status_code == 404
    bad = alice.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "events": ["nope"]})
    assert bad.status_code == 400
    assert bob.delete(f"/v1/webhooks/{hook['webhook_id']}").status_code == 404
    assert alice.delete(f"/v1/webhooks/{hook['webhook_id']}").status_code == 204
    assert alice.get("/v1/webhooks").json() == []
