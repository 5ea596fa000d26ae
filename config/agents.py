"""AGENTSTATE_AGENTS: the agents a deployment runs beside its default one.

The value is a comma-separated list of ``name=dotted.path[:attribute]`` entries: a module or
object of phase handlers, a compiled LangGraph graph, a Pydantic AI ``Agent``... (the kind
is found from the object, by ``tasks.agents.registry``). ``default`` names the default agent
(AGENTSTATE_AGENT) and cannot be taken. Parsing imports nothing: an app that only sends
messages learns the names without importing any agent or framework.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from state.errors import ConfigurationError

VARIABLE = "AGENTSTATE_AGENTS"
DEFAULT_AGENT = "default"
# A name travels in URLs (``/agui/{agent}``), tool names (``ask_{agent}``) and the
# session row (64 characters).
AGENT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_TARGET = re.compile(r"[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?")


def parse_agents(text: str) -> dict[str, str]:
    """``{name: target}`` from the variable's value, in order; ConfigurationError naming
    the entry if one is malformed or a name repeats (or is ``default``)."""
    table: dict[str, str] = {}
    entries = [entry.strip() for entry in text.split(",")]
    for number, entry in enumerate((e for e in entries if e), start=1):
        name, equals, target = (part.strip() for part in entry.partition("="))
        where = f"{VARIABLE}: entry {number}"
        if not equals or not AGENT_NAME.fullmatch(name) or not _TARGET.fullmatch(target):
            raise ConfigurationError(
                f"{where} is not name=dotted.path[:attribute] (a name is a lowercase letter, "
                "then up to 63 lowercase letters, digits, '_' or '-')"
            )
        if name == DEFAULT_AGENT:
            raise ConfigurationError(
                f"{where}: {DEFAULT_AGENT!r} is the default agent (set AGENTSTATE_AGENT)"
            )
        if name in table:
            raise ConfigurationError(f"{where}: agent {name!r} is named twice")
        table[name] = target
    return table


CONFIG_VARIABLE = "AGENTSTATE_LANGGRAPH_CONFIG"
FILE_TARGET = "file:"  # a target that names a file path, ``file:/abs/path.py:attribute``


def langgraph_graphs(path: str) -> dict[str, str]:
    """``{name: target}`` of the ``graphs`` of a ``langgraph.json`` (LangGraph's own
    config file, as a project has it): ``"name": "./src/graph.py:graph"`` (a file, relative
    to the config file) or ``"name": "package.module:graph"``. ConfigurationError naming
    the variable if the file cannot be read or a graph is malformed."""
    if not path:
        return {}
    config = Path(path)
    try:
        document = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{CONFIG_VARIABLE}: cannot read {path}: {exc}") from None
    graphs = document.get("graphs") if isinstance(document, dict) else None
    if not isinstance(graphs, dict):
        raise ConfigurationError(f'{CONFIG_VARIABLE}: {path} has no "graphs" object')
    table: dict[str, str] = {}
    for name, spec in graphs.items():
        where = f"{CONFIG_VARIABLE}: graph {name!r}"
        if not AGENT_NAME.fullmatch(str(name)) or name == DEFAULT_AGENT:
            raise ConfigurationError(
                f"{where}: a name here is a lowercase letter, then up to 63 lowercase "
                f"letters, digits, '_' or '-' (and not {DEFAULT_AGENT!r})"
            )
        found = spec.get("path") if isinstance(spec, dict) else spec
        location, colon, attribute = str(found or "").rpartition(":")
        if not colon or not location or not attribute.isidentifier():
            raise ConfigurationError(f'{where} is not "path.py:attribute" or "module:attribute"')
        if location.endswith(".py") or "/" in location:
            file = (config.parent / location).resolve()
            table[name] = f"{FILE_TARGET}{file}:{attribute}"
        else:
            table[name] = f"{location}:{attribute}"
    return table
