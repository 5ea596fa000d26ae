"""The HTTP service's pure parts: the key table, the error map, the SSE encoding, the
request models, and AGENTSTATE_API_KEYS as a setting (a secret)."""

from __future__ import annotations

import hmac
import inspect
import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

import state.errors
from config import Settings, child_environment
from config.api_keys import parse_api_keys
from config.urls import SecretFilter
from state.errors import BadInputError, ConfigurationError, UnauthorizedError
from tasks.server.auth import OPERATOR_CALLER, Caller, KeyTable
from tasks.server.errors import status_of
from tasks.server.models import DecisionIn, MessageIn, MultitaskStrategy
from tasks.server.sse import StreamSlots, encode, last_event_id


def test_keys_parse_into_users_and_operators() -> None:
    a, b, op = "a1" * 8, "b2" * 8, "op" * 8
    assert parse_api_keys(f"{a}:alice, {b}:bob\n{op}:*,") == {a: "alice", b: "bob", op: "*"}
    assert parse_api_keys(f"{a}:user:with:colons") == {a: "user:with:colons"}
    assert parse_api_keys("") == {}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("justakey", "not key:user_id"),
        (":alice", "not key:user_id"),
        ("k y:alice", "not key:user_id"),
        ("k:bad user", "the user must be"),
        ("k:a,k:b", "listed twice"),
        (",", "lists no key"),
    ],
)
def test_bad_keys_are_refused_naming_the_variable_not_the_key(value: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as caught:
        parse_api_keys(value)
    assert str(caught.value).startswith("AGENTSTATE_API_KEYS")
    for part in value.replace(",", ":").split(":"):
        if len(part) > 3:
            assert part not in str(caught.value)


def test_every_key_is_compared_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    table = KeyTable({"first-key": "alice", "second-key": "bob", "third-key": "*"})
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    assert table.caller("first-key") == Caller("alice")
    assert len(compared) == 3  # the match came first; the others were compared all the same
    assert table.caller("third-key") == OPERATOR_CALLER
    for wrong in (None, "", "first-ke", "first-keyy", "FIRST-KEY"):
        with pytest.raises(UnauthorizedError):
            table.caller(wrong)


def test_without_keys_every_caller_is_the_operator() -> None:
    assert KeyTable({}).caller(None) == OPERATOR_CALLER
    assert KeyTable({}).caller("anything") == OPERATOR_CALLER


def test_api_keys_are_a_secret_of_the_settings(tmp_path: Path) -> None:
    settings = Settings(api_keys="sekrit-key-1-long-enough:alice,sekrit-key-2-long-enough:*")
    assert "sekrit" not in repr(settings) and "sekrit" not in str(settings)
    assert settings.api_key_users == {
        "sekrit-key-1-long-enough": "alice",
        "sekrit-key-2-long-enough": "*",
    }
    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "got sekrit-key-1-long-enough", None, None
    )
    SecretFilter().filter(record)
    assert "sekrit-key-1-long-enough" not in record.getMessage()
    secret = tmp_path / "keys"
    secret.write_text("file-key-1-long-enough:alice\nfile-key-2-long-enough:*\n")
    from_file = Settings(api_keys_file=str(secret))
    assert from_file.api_key_users == {
        "file-key-1-long-enough": "alice",
        "file-key-2-long-enough": "*",
    }
    assert "AGENTSTATE_API_KEYS" not in child_environment(from_file)  # the file is passed on
    with pytest.raises(ConfigurationError, match="not both"):
        Settings(api_keys="k:a", api_keys_file=str(secret))


def test_a_short_key_refuses_the_start_naming_the_setting() -> None:
    for value in ("x:alice", "fifteen-chars-x:*", f"{'k' * 20}:alice,short-key:bob"):
        with pytest.raises(ConfigurationError) as caught:
            parse_api_keys(value)
        line = str(caught.value)
        assert line.startswith("AGENTSTATE_API_KEYS") and "16 characters" in line
        assert "\n" not in line and "short-key" not in line
    assert parse_api_keys("sixteen-chars-xx:alice") == {"sixteen-chars-xx": "alice"}


def test_comments_and_blank_lines_of_the_keys_file_are_not_keys(tmp_path: Path) -> None:
    secret = tmp_path / "keys"
    live, retired = "a-live-key-of-alice-1234", "a-retired-key-of-bob-123"
    secret.write_text(f"# the team's keys\n\n{live}:alice\n#{retired}:bob\n  # {retired}:*\n\n")
    assert Settings(api_keys_file=str(secret)).api_key_users == {live: "alice"}
    with pytest.raises(UnauthorizedError):
        KeyTable(parse_api_keys(secret.read_text())).caller(retired)


def test_bad_input_never_answers_5xx() -> None:
    bad_input = [
        cls
        for _, cls in inspect.getmembers(state.errors, inspect.isclass)
        if issubclass(cls, BadInputError) and cls is not state.errors.DatabaseNotFoundError
    ]
    assert len(bad_input) > 10
    for cls in bad_input:
        status, _ = status_of(cls("x"))
        assert 400 <= status < 500, cls
    assert status_of(state.errors.NotFoundError("x")) == (404, "not_found")
    assert status_of(state.errors.SessionOwnershipError("x")) == (404, "not_found")
    assert status_of(state.errors.IdempotencyConflictError("x")) == (409, "conflict")
    assert status_of(state.errors.ApprovalAlreadyDecidedError("x")) == (409, "conflict")
    assert status_of(state.errors.MessageTooLargeError("x")) == (413, "bad_input")
    assert status_of(state.errors.ServiceUnavailableError("x")) == (503, "unavailable")
    assert status_of(RuntimeError("a bug")) == (500, "failure")


def test_sse_messages_and_last_event_ids() -> None:
    event = {"seq": 7, "kind": "reply", "data": {"text": "a\nb"}}
    assert encode(event) == b'id: 7\ndata: {"seq":7,"kind":"reply","data":{"text":"a\\nb"}}\n\n'
    assert not encode({"seq": None, "kind": "token"}).startswith(b"id:")
    assert last_event_id("12") == 12 and last_event_id(" 3 ") == 3
    for bad in (None, "", "-1", "x", "1.5", str(2**64)):
        assert last_event_id(bad) is None


def test_stream_slots_refuse_past_the_limit_and_free_once() -> None:
    slots = StreamSlots(2)
    first, second = slots.take(), slots.take()
    with pytest.raises(state.errors.ServiceUnavailableError, match="AGENTSTATE_MAX_STREAMS"):
        slots.take()
    first()
    first()  # releasing twice frees one slot, once
    assert slots.open == 1
    slots.take()
    second()
    assert slots.open == 1


def test_request_bodies_are_strict() -> None:
    assert MessageIn.model_validate({"text": "hi", "user_id": "u"}).multitask_strategy == (
        MultitaskStrategy.ENQUEUE
    )
    assert MessageIn.model_validate(
        {"text": "hi", "user_id": "u", "multitask_strategy": "reject"}
    ).multitask_strategy == (MultitaskStrategy.REJECT)
    for bad in (
        {"text": 1, "user_id": "u"},
        {"text": "hi", "user_id": "has space"},
        {"text": "hi", "user_id": "u", "more": 1},
        {"text": "hi", "user_id": "u", "multitask_strategy": "later"},
    ):
        with pytest.raises(ValidationError):
            MessageIn.model_validate(bad)
    with pytest.raises(ValidationError):
        DecisionIn.model_validate({"approve": "true", "by": "me"})


def test_a_key_in_a_url_is_scrubbed_and_the_access_line_still_written() -> None:
    from uvicorn.logging import AccessFormatter

    key = "a-key-someone-pasted-into-a-url"
    parse_api_keys(f"{key}:alice")
    args = ("127.0.0.1:5000", "GET", f"/v1/sessions?key={key}", "1.1", 200)
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None
    )
    SecretFilter().filter(record)
    line = AccessFormatter("%(client_addr)s %(request_line)s %(status_code)s").format(record)
    assert key not in line and "GET /v1/sessions?key=" in line and "200" in line
