"""The Python code blocks of the README and the docs pages, as the site shows them.

A block is one of three kinds, and the tests hold each to its own standard:
- included from ``examples/`` (``--8<-- "examples/NAME.py..."``): the file is the example,
  and the e2e tests run it;
- complete (it names nothing it does not define or import): tests/e2e/test_docs_examples.py
  runs it against real workers;
- written for the HTTP API (complete but for the caller's KEY): run against
  ``agentstate serve`` by the same e2e test;
- a fragment (it uses an ``agent`` or a handler's names defined elsewhere on its page): it
  must compile, and be listed in FRAGMENTS, so a new one is a decision, not an accident.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', re.M)
# ```{.python} for blocks that include a file: ruff formats ```python blocks in Markdown,
# and would rewrite the include line as if it were Python.
BLOCK = re.compile(r"```(?:python|\{\.python\})\n(.*?)```", re.S)

# Blocks that are parts of a page's story, not programs: (page, their first line).
FRAGMENTS = {
    ("docs/guides/a2a.md", "config = pb.TaskPushNotificationConfig("),
    ("docs/guides/approvals.md", "# in your agent (planning or executing may ask)"),
    ("docs/guides/apps.md", "workflow_id = agent.start_workflow("),
    ("docs/guides/async-client.md", "async with AsyncAgentClient() as agent:"),
    ("docs/guides/run-control.md", '@action("charge")'),
    ("docs/guides/multi-user.md", "from tasks.client import AgentClient"),
    ("docs/guides/many-agents.md", "from langgraph_sdk import get_sync_client"),
    (
        "docs/guides/many-agents.md",
        'client.send_message("s-1", "plan my week", user_id="alice", agent="planner")',
    ),
    ("docs/guides/streaming.md", "# my_agent.py   (AGENTSTATE_AGENT=my_agent)"),
    (
        "docs/guides/run-control.md",
        "# A retried HTTP request or a double click: one message, one turn, the first message id.",
    ),
}
# Complete programs that need what the tests do not install (a web framework of the app's).
NOT_RUN = {("docs/guides/apps.md", "from flask import Flask, jsonify, request")}
# Programs for the HTTP API: complete but for their KEY; run against `agentstate serve`.
SERVED = {
    ("docs/guides/http-api.md", "import json"),
    ("docs/guides/agui.md", "import json"),
    ("docs/guides/a2a.md", "import asyncio"),
    ("docs/guides/mcp.md", "import asyncio"),
}


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    code: str  # as the site shows it, includes resolved
    includes: tuple[str, ...]  # the files (with their line range or section) it includes

    @property
    def first_line(self) -> str:
        return self.code.strip().splitlines()[0]

    @property
    def key(self) -> tuple[str, str]:
        return (self.page, self.first_line)


def resolve(spec: str) -> str:
    """The text ``--8<-- "spec"`` includes: a file, ``file:start:end`` (1-based lines, end
    optional) or ``file:section`` (between ``--8<-- [start:section]`` and its end)."""
    name, _, rest = spec.partition(":")
    lines = (REPO / name).read_text(encoding="utf-8").splitlines()
    if not rest:
        chosen = lines
    elif re.fullmatch(r"\d+:\d*", rest):
        start, end = rest.split(":")
        chosen = lines[int(start) - 1 : int(end) if end else None]
    else:
        start_marker, end_marker = f"--8<-- [start:{rest}]", f"--8<-- [end:{rest}]"
        begin = next(i for i, line in enumerate(lines) if line.endswith(start_marker))
        end = next(i for i, line in enumerate(lines) if line.endswith(end_marker))
        chosen = lines[begin + 1 : end]
    return "\n".join(line for line in chosen if "--8<-- [" not in line) + "\n"


# What docs/hooks/reference.py writes from the code (usage lines, signatures): not prose.
GENERATED = re.compile(r"^<!-- reference:(\w+) -->$.*?^<!-- /reference:\1 -->$", re.M | re.S)


def written(path: Path) -> str:
    """The page as its author wrote it: without the reference blocks generated from code."""
    return GENERATED.sub("", path.read_text(encoding="utf-8"))


@cache
def blocks() -> tuple[Block, ...]:
    found = []
    for path in PAGES:
        for match in BLOCK.finditer(written(path)):
            raw = match.group(1)
            includes = tuple(INCLUDE.findall(raw))
            code = INCLUDE.sub(lambda m: resolve(m.group(1)).rstrip("\n"), raw)
            found.append(Block(str(path.relative_to(REPO)), code, includes))
    return tuple(found)


def undefined_names(code: str) -> list[str]:
    """The names ``code`` uses without defining or importing them (ruff's F821)."""
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("ruff")),
            "check",
            "--no-cache",
            "--isolated",
            "--select",
            "F821",
            "--output-format",
            "concise",
            "--stdin-filename",
            "block.py",
            "-",
        ],
        input=code,
        capture_output=True,
        text=True,
        check=False,
    )
    return re.findall(r"Undefined name `(\w+)`", result.stdout)


def complete_blocks() -> list[Block]:
    """The blocks that are whole programs of their own, and run as they are."""
    return [
        block
        for block in blocks()
        if not block.includes and block.key not in FRAGMENTS | NOT_RUN | SERVED
    ]
