"""The versioned migrator: every load upgrades to CURRENT_VERSION, step by step."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import state.migrate
from state.errors import FutureVersionError, MigrationError
from state.migrate import CURRENT_VERSION, Migration, StateMigrator, stamp

V3_MESSAGE_KEYS = {"role", "content", "timestamp", "metadata"}


@pytest.fixture
def migrator() -> StateMigrator:
    return StateMigrator()


def v1_doc() -> dict[str, Any]:
    return {
        "session_id": "s-1",
        "user_id": "u-1",
        "context": {"topic": "cats", "nested": {"a": [1, 2]}},
        "message_history": [
            {"role": "user", "content": "hi", "ts": "2024-01-01T00:00:00+00:00"},
            {"role": "assistant", "content": "hello", "ts": "2024-01-01T00:00:01+00:00"},
        ],
    }


def v2_doc() -> dict[str, Any]:
    doc = v1_doc()
    doc["_version"] = 2
    doc["tool_results"] = [{"tool": "calculate", "value": "84"}]
    return doc


def v3_doc() -> dict[str, Any]:
    return {
        "_version": 3,
        "session_id": "s-1",
        "tool_results": [],
        "message_history": [
            {
                "role": "user",
                "content": "hi",
                "timestamp": "2024-01-01T00:00:00+00:00",
                "metadata": {"message_id": "m-1"},
            }
        ],
    }


def test_current_version_is_3() -> None:
    assert StateMigrator.CURRENT_VERSION == 3
    assert CURRENT_VERSION == 3
    assert StateMigrator().CURRENT_VERSION == 3


def test_registry_is_ordered_and_named() -> None:
    registry = StateMigrator.MIGRATIONS
    assert [m.from_version for m in registry] == [1, 2]
    assert [m.name for m in registry] == ["add_tool_results", "reshape_message_history"]
    assert all(isinstance(m, Migration) and callable(m.upgrade) for m in registry)
    assert len(registry) + 1 == StateMigrator.CURRENT_VERSION


def test_v1_gains_tool_results_and_reshaped_history(migrator: StateMigrator) -> None:
    doc = v1_doc()
    out = migrator.migrate(doc)
    assert out["_version"] == 3
    assert out["tool_results"] == []
    assert out["message_history"] == [
        {
            "role": "user",
            "content": "hi",
            "timestamp": "2024-01-01T00:00:00+00:00",
            "metadata": {},
        },
        {
            "role": "assistant",
            "content": "hello",
            "timestamp": "2024-01-01T00:00:01+00:00",
            "metadata": {},
        },
    ]
    # Other fields are carried over untouched.
    assert out["session_id"] == "s-1"
    assert out["user_id"] == "u-1"
    assert out["context"] == {"topic": "cats", "nested": {"a": [1, 2]}}


def test_v1_keeps_existing_tool_results(migrator: StateMigrator) -> None:
    doc = v1_doc()
    doc["tool_results"] = [{"tool": "x"}]
    assert migrator.migrate(doc)["tool_results"] == [{"tool": "x"}]


def test_v1_without_history_gets_an_empty_list(migrator: StateMigrator) -> None:
    out = migrator.migrate({"session_id": "s"})
    assert out == {"session_id": "s", "tool_results": [], "message_history": [], "_version": 3}


def test_v2_only_gets_reshaped_history(migrator: StateMigrator) -> None:
    doc = v2_doc()
    out = migrator.migrate(doc)
    expected = copy.deepcopy(doc)
    expected["_version"] = 3
    expected["message_history"] = [
        {"role": m["role"], "content": m["content"], "timestamp": m["ts"], "metadata": {}}
        for m in doc["message_history"]
    ]
    assert out == expected
    assert out["tool_results"] == [{"tool": "calculate", "value": "84"}]


def test_v2_without_tool_results_does_not_gain_them(migrator: StateMigrator) -> None:
    out = migrator.migrate({"_version": 2, "message_history": []})
    assert "tool_results" not in out
    assert out == {"_version": 3, "message_history": []}


def test_v3_is_returned_equal(migrator: StateMigrator) -> None:
    doc = v3_doc()
    out = migrator.migrate(doc)
    assert out == doc
    assert out is not doc


@pytest.mark.parametrize("make", [v1_doc, v2_doc, v3_doc])
def test_migrate_never_mutates_its_input(migrator: StateMigrator, make: Any) -> None:
    doc = make()
    snapshot = copy.deepcopy(doc)
    out = migrator.migrate(doc)
    assert doc == snapshot
    assert out is not doc
    # The copy is deep: changing the result does not reach the input.
    out["message_history"].append({"role": "user"})
    if "context" in out:
        out["context"]["nested"]["a"].append(3)
    assert doc == snapshot


@pytest.mark.parametrize("make", [v1_doc, v2_doc, v3_doc])
def test_migration_is_idempotent(migrator: StateMigrator, make: Any) -> None:
    once = migrator.migrate(make())
    assert migrator.migrate(once) == once
    assert not migrator.needs_migration(once)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            {"role": "assistant", "content": "x", "ts": "T1"},
            {"role": "assistant", "content": "x", "timestamp": "T1", "metadata": {}},
        ),
        (
            {"role": "user", "content": "x", "timestamp": "T2", "ts": "T1"},
            {"role": "user", "content": "x", "timestamp": "T2", "metadata": {}},
        ),
        (
            {"ts": "T1"},
            {"role": "user", "content": "", "timestamp": "T1", "metadata": {}},
        ),
        (
            {"content": "c", "ts": "T1", "metadata": {"k": "v"}},
            {"role": "user", "content": "c", "timestamp": "T1", "metadata": {"k": "v"}},
        ),
        (
            {"role": "tool", "content": "c", "ts": "T1", "metadata": "junk"},
            {"role": "tool", "content": "c", "timestamp": "T1", "metadata": {}},
        ),
        (
            {"role": "user", "content": "c", "ts": "T1", "extra": 1},
            {"role": "user", "content": "c", "timestamp": "T1", "metadata": {}},
        ),
    ],
)
def test_history_item_reshape(
    migrator: StateMigrator, item: dict[str, Any], expected: dict[str, Any]
) -> None:
    out = migrator.migrate({"_version": 2, "message_history": [item]})
    assert out["message_history"] == [expected]


def test_history_item_without_any_timestamp_gets_one(migrator: StateMigrator) -> None:
    out = migrator.migrate({"_version": 2, "message_history": [{"role": "user"}]})
    [item] = out["message_history"]
    assert set(item) == V3_MESSAGE_KEYS
    assert isinstance(item["timestamp"], str)
    assert item["timestamp"]


@pytest.mark.parametrize("version", [4, 5, 1000])
def test_future_version_is_refused(migrator: StateMigrator, version: int) -> None:
    doc = {"_version": version, "message_history": "not even valid"}
    snapshot = copy.deepcopy(doc)
    with pytest.raises(FutureVersionError) as info:
        migrator.migrate(doc)
    assert isinstance(info.value, MigrationError)
    assert str(version) in str(info.value)
    assert doc == snapshot
    with pytest.raises(FutureVersionError):
        migrator.needs_migration(doc)


def test_future_version_error_is_a_migration_error() -> None:
    assert issubclass(FutureVersionError, MigrationError)


@pytest.mark.parametrize("version", [0, -1, True, False, "2", 2.0, None, [3]])
def test_invalid_version_is_refused(migrator: StateMigrator, version: object) -> None:
    doc = {"_version": version, "message_history": []}
    with pytest.raises(MigrationError, match="_version") as info:
        migrator.migrate(doc)
    assert not isinstance(info.value, FutureVersionError)
    with pytest.raises(MigrationError):
        migrator.needs_migration(doc)


@pytest.mark.parametrize(
    "history",
    ["abc", {"a": 1}, 5, {}, "", 0],
    ids=["str", "dict", "int", "empty-dict", "empty-str", "zero"],
)
@pytest.mark.parametrize("version", [1, 2])
def test_non_list_history_is_refused(
    migrator: StateMigrator, history: object, version: int
) -> None:
    doc = {"_version": version, "message_history": history}
    with pytest.raises(MigrationError, match="message_history"):
        migrator.migrate(doc)


@pytest.mark.parametrize("item", ["hello", 3, None, ["user", "hi"]])
def test_non_object_history_item_is_refused(migrator: StateMigrator, item: object) -> None:
    with pytest.raises(MigrationError, match="history item"):
        migrator.migrate({"_version": 2, "message_history": [{"role": "user"}, item]})


@pytest.mark.parametrize("doc", [[], "x", None, 3])
def test_non_object_document_is_refused(migrator: StateMigrator, doc: object) -> None:
    with pytest.raises(MigrationError):
        migrator.migrate(doc)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({}, True),
        ({"_version": 1}, True),
        ({"_version": 2}, True),
        ({"_version": 3}, False),
    ],
)
def test_needs_migration(migrator: StateMigrator, doc: dict[str, Any], expected: bool) -> None:
    assert migrator.needs_migration(doc) is expected


def test_version_of(migrator: StateMigrator) -> None:
    assert migrator.version_of({}) == 1
    assert migrator.version_of({"_version": 2}) == 2


def test_stamp_marks_current_and_returns_the_same_dict() -> None:
    doc: dict[str, Any] = {"_version": 1, "a": 1}
    out = stamp(doc)
    assert out is doc
    assert doc == {"_version": 3, "a": 1}
    assert not StateMigrator().needs_migration(stamp({}))


def _noop(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


@pytest.mark.parametrize(
    "registry",
    [
        (Migration(2, "b", _noop), Migration(1, "a", _noop)),
        (Migration(1, "a", _noop), Migration(3, "c", _noop)),
        (Migration(0, "z", _noop),),
        (Migration(1, "a", _noop), Migration(1, "a2", _noop)),
    ],
)
def test_latest_version_rejects_out_of_order_registry(registry: tuple[Migration, ...]) -> None:
    with pytest.raises(MigrationError, match="out of order"):
        state.migrate._latest_version(registry)


@pytest.mark.parametrize(("length", "latest"), [(0, 1), (1, 2), (2, 3), (5, 6)])
def test_latest_version_of_ordered_registry(length: int, latest: int) -> None:
    registry = tuple(Migration(i, f"m{i}", _noop) for i in range(1, length + 1))
    assert state.migrate._latest_version(registry) == latest


def test_migrations_run_in_registry_order_from_the_document_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    def recorder(name: str) -> Any:
        def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
            calls.append(name)
            return doc

        return upgrade

    registry = tuple(Migration(i, f"m{i}", recorder(f"m{i}")) for i in range(1, 5))
    monkeypatch.setattr(StateMigrator, "MIGRATIONS", registry)
    monkeypatch.setattr(StateMigrator, "CURRENT_VERSION", 5)
    assert StateMigrator().migrate({"_version": 2}) == {"_version": 5}
    assert calls == ["m2", "m3", "m4"]
