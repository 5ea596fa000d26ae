"""AGENTSTATE_AGENTS: parsed at start (one clear error naming the entry), kinds found from
the objects without importing any framework, and framework turns' time limits."""

from __future__ import annotations

import sys
import types

import pytest

from config import Settings
from config.agents import parse_agents
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
