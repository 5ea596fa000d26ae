"""AGENTSTATE_AGENTS: parsed at start (one clear error naming the entry), kinds found from
the objects without importing any framework, and framework turns' time limits."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from config import Settings
from config.agents import langgraph_graphs, parse_agents
from state.errors import BadInputError, ConfigurationError
from tasks.agents.registry import checked_agent, kind_of

TINY = {"redis_url": "redis://localhost:6379/0", "database_url": "sqlite:///x.db"}


def test_entries_parse_in_order() -> None:
    assert parse_agents(" a=pkg.mod , b-2=pkg.mod:graph.compiled,,") == {
        "a": "pkg.mod",
        "b-2": "pkg.mod:graph.compiled",
    }
    assert parse_agents("") == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a", "entry 1 is not name=dotted.path"),
        ("a=ok,B=pkg", "entry 2 is not name=dotted.path"),
        ("a=pkg mod", "entry 1 is not"),
        ("a=pkg,a=other", "entry 2: agent 'a' is named twice"),
        ("default=pkg", "the default agent"),
        ("a=:x", "entry 1 is not"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(value: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_agents(value)
    with pytest.raises(ConfigurationError, match="AGENTSTATE_AGENTS"):
        Settings(**TINY, agents=value)


def test_framework_agents_lengthen_the_task_time_limit() -> None:
    plain = Settings(**TINY)
    assert plain.task_time_limit == 360.0
    many = Settings(**TINY, agents="g=pkg:graph", framework_turn_timeout=600)
    assert many.task_time_limit > 600
    assert many.visibility_timeout_s >= 4 * many.task_time_limit


def test_kinds_come_from_the_object() -> None:
    module = types.ModuleType("handlers")
    assert kind_of(module) == "phases"

    class Graph:
        def stream(self) -> None: ...
        def get_state(self) -> None: ...

    Graph.__module__ = "langgraph.graph.state"
    assert kind_of(Graph()) == "langgraph"

    class Agent:
        def run(self) -> None: ...

    Agent.__module__ = "pydantic_ai.agent"
    assert kind_of(Agent()) == "pydantic-ai"
    # No framework was imported to tell.
    assert "pydantic_ai" not in sys.modules


def test_a_message_may_name_only_a_configured_agent() -> None:
    settings = Settings(**TINY, agents="a=pkg")
    assert checked_agent(settings, None) is None
    assert checked_agent(settings, "default") == "default"
    assert checked_agent(settings, "a") == "a"
    with pytest.raises(BadInputError, match="unknown agent 'b'; the agents are"):
        checked_agent(settings, "b")


def test_a_framework_turn_gets_the_framework_deadline() -> None:
    from state.agent import PhaseContext
    from state.turns.rules import TURN_TIMEOUT_KEY
    from tasks.agents.framework import FrameworkAgent
    from tasks.agents.registry import FrameworkTurn, TurnOutcome

    class Adapter:
        def run_turn(self, turn: FrameworkTurn) -> TurnOutcome:
            return TurnOutcome(reply=f"ran {turn.ctx.message}")

    agent = FrameworkAgent("g", Adapter(), Settings(**TINY, framework_turn_timeout=42))
    ctx = PhaseContext("s", "u", "understanding", "hi", "m", {}, [], [], {})
    assert agent.run("understanding", ctx).context == {TURN_TIMEOUT_KEY: 42}
    assert agent.run("executing", ctx).context == {"framework_reply": "ran hi"}
    assert not agent.is_quick("executing") and agent.is_quick("planning")


def test_a_langgraph_json_names_agents(tmp_path: Path) -> None:
    config = tmp_path / "langgraph.json"
    config.write_text(
        json.dumps({"graphs": {"chat": "./src/chat.py:graph", "ops": "pkg.ops:graph"}})
    )
    assert langgraph_graphs(str(config)) == {
        "chat": f"file:{(tmp_path / 'src' / 'chat.py').resolve()}:graph",
        "ops": "pkg.ops:graph",
    }
    settings = Settings(**TINY, agents="a=pkg", langgraph_config=str(config))
    assert list(settings.agent_targets) == ["a", "chat", "ops"]
    assert settings.task_time_limit > settings.framework_turn_timeout


@pytest.mark.parametrize(
    ("graphs", "message"),
    [
        ({"Chat": "./a.py:graph"}, "graph 'Chat': a name here"),
        ({"chat": "./a.py"}, "graph 'chat' is not"),
        (None, 'has no "graphs" object'),
    ],
)
def test_a_bad_langgraph_json_is_refused_naming_the_variable(
    tmp_path: Path, graphs: object, message: str
) -> None:
    config = tmp_path / "langgraph.json"
    config.write_text(json.dumps({"graphs": graphs} if graphs is not None else {}))
    with pytest.raises(ConfigurationError, match=message):
        Settings(**TINY, langgraph_config=str(config))
    with pytest.raises(ConfigurationError, match="AGENTSTATE_LANGGRAPH_CONFIG: cannot read"):
        Settings(**TINY, langgraph_config=str(tmp_path / "missing.json"))
    config.write_text(json.dumps({"graphs": {"a": "pkg:graph"}}))
    with pytest.raises(ConfigurationError, match="both name 'a'"):
        Settings(**TINY, agents="a=pkg", langgraph_config=str(config))
