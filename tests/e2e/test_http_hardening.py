"""The network face of issue 39, against a real ``agentstate serve`` (and ``create_app()``
under plain uvicorn): no-key mode answers only to a loopback Host and to no cross-site
write; a wrong key is refused before the body is read and, repeated, slowed to 429; a
connection that never finishes its headers is closed."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from config import Settings
from tasks.worker.processes import answers, free_port, launch, stop
from tests.api_support import Api, new_keys, read, serving
from tests.support import REPO, make_settings, settings_env, uid

EVIL = "rebind.evil.example"


@pytest.fixture(scope="module")
def settings(pg_url: str) -> Settings:
    return make_settings(pg_url, queue=uid("q"))  # no workers: nothing here needs a turn


@pytest.fixture(scope="module")
def keyless(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with serving(settings, tmp_path_factory.mktemp("keyless"), None) as running:
        yield running


@pytest.fixture(scope="module")
def keyed(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    env = {"AGENTSTATE_HTTP_BAD_KEY_LIMIT": "3", "AGENTSTATE_HTTP_HEADER_TIMEOUT": "1"}
    with serving(settings, tmp_path_factory.mktemp("keyed"), new_keys("alice"), **env) as running:
        yield running


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1", "[::1]:1234", "LOCALHOST"])
def test_no_key_mode_answers_a_loopback_host(keyless: Api, host: str) -> None:
    answer = keyless.client().get("/v1/me", headers={"Host": host})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("host", [EVIL, f"{EVIL}:8000", "127.0.0.1.nip.io", "10.0.0.1"])
def test_no_key_mode_refuses_any_other_host(keyless: Api, host: str) -> None:
    client = keyless.client()
    answer = client.get("/v1/me", headers={"Host": host})
    assert answer.status_code == 421, answer.text
    assert answer.json()["kind"] == "misdirected"
    user = uid("victim")
    client.post(f"/v1/sessions/{uid('s')}/messages", json={"text": "hi", "user_id": user})
    assert client.delete(f"/v1/users/{user}", headers={"Host": host}).status_code == 421


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": f"http://{EVIL}:8000"},
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
def test_no_key_mode_refuses_a_cross_site_write(keyless: Api, headers: dict[str, str]) -> None:
    client = keyless.client()
    for path in (f"/v1/workflows/{uid('wf')}/cancel", f"/v1/sessions/{uid('s')}/cancel"):
        # A plain HTML form's POST: no body, no JSON.
        answer = client.post(
            path, headers={**headers, "Content-Type": "application/x-www-form-urlencoded"}
        )
        assert answer.status_code == 403, answer.text
    assert client.get("/v1/me", headers=headers).status_code == 200  # reads: CORS guards them


@pytest.mark.parametrize(
    "headers", [{"Origin": "http://localhost:5173"}, {"Sec-Fetch-Site": "same-origin"}, {}]
)
def test_no_key_mode_takes_a_write_of_this_machine(keyless: Api, headers: dict[str, str]) -> None:
    answer = keyless.client().post(f"/v1/workflows/{uid('wf')}/cancel", headers=headers)
    assert answer.status_code == 404, answer.text  # reached the route: an unknown workflow


def test_create_app_under_plain_uvicorn_refuses_a_foreign_host(
    settings: Settings, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "uvicorn.log"
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "tasks.server.app:create_app",
        "--port",
        str(port),
    ]
    proc = launch(command, settings_env(settings), log, REPO)
    try:
        assert answers(proc, f"http://127.0.0.1:{port}/healthz", 60), read(log)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            assert client.get("/v1/me").status_code == 200
            assert client.get("/v1/me", headers={"Host": EVIL}).status_code == 421
            forged = client.post(
                f"/v1/workflows/{uid('wf')}/retry", headers={"Origin": "https://evil.example"}
            )
            assert forged.status_code == 403
    finally:
        stop([proc])


def head_only(api: Api, head: str) -> socket.socket:
    """A connection that sent ``head`` (and nothing of the body it announces)."""
    port = int(api.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head.encode())
    return sock


def test_a_wrong_key_is_refused_before_the_body_is_read(keyed: Api) -> None:
    head = (
        f"POST /v1/sessions/{uid('s')}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Authorization: Bearer not-the-key-at-all\r\nContent-Type: application/json\r\n"
        "Content-Length: 2000000\r\n\r\n"
    )
    with head_only(keyed, head) as sock:
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401"), answer


def test_repeated_wrong_keys_from_one_address_get_429(settings: Settings, tmp_path: Path) -> None:
    keys = new_keys("alice")
    with serving(settings, tmp_path, keys, AGENTSTATE_HTTP_BAD_KEY_LIMIT="3") as api:
        wrong = api.client(Authorization="Bearer wrong-key-number-one-xx")
        assert [wrong.get("/v1/me").status_code for _ in range(3)] == [401] * 3
        limited = wrong.get("/v1/me")
        assert limited.status_code == 429, limited.text
        assert int(limited.headers["Retry-After"]) >= 1
        assert limited.json()["kind"] == "rate_limited"
        # The address waits, whatever key it tries next.
        assert api.client("alice").get("/v1/me").status_code == 429
        assert api.client().get("/healthz").status_code == 200  # no key needed: not counted


def test_a_connection_that_never_finishes_its_headers_is_closed(keyed: Api) -> None:
    with head_only(keyed, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ") as sock:
        assert sock.recv(4096) == b""  # closed by the server, not by our timeout (30 s)


def test_one_key_holds_at_most_its_share_of_the_streams(settings: Settings, tmp_path: Path) -> None:
    keys = new_keys("alice", "bob")
    with serving(settings, tmp_path, keys, AGENTSTATE_MAX_STREAMS_PER_KEY="2") as api:
        alice, bob = api.client("alice"), api.client("bob")
        paths = {}
        for user, client in (("alice", alice), ("bob", bob)):
            session_id = uid("s")
            sent = client.post(
                f"/v1/sessions/{session_id}/messages", json={"text": "hi", "user_id": user}
            )
            assert sent.status_code == 202, sent.text
            paths[user] = f"/v1/sessions/{session_id}/events"
        with alice.stream("GET", paths["alice"]) as one, alice.stream("GET", paths["alice"]) as two:
            assert one.status_code == two.status_code == 200
            third = alice.get(paths["alice"])
            assert third.status_code == 429, third.text
            assert "AGENTSTATE_MAX_STREAMS_PER_KEY" in third.json()["error"]
            assert third.headers["Retry-After"]
            with bob.stream("GET", paths["bob"]) as others:
                assert others.status_code == 200  # another key's share is its own
        with alice.stream("GET", paths["alice"], params={"timeout": 0.5}) as again:
            assert again.status_code == 200  # closed streams gave their slots back
            again.read()
