"""The reference pages, written from the code: committed, and checked by the tests.

A page marks where generated Markdown goes with two lines, ``<!-- reference:NAME -->`` and
``<!-- /reference:NAME -->``; what is between them is written by ``python
docs/hooks/reference.py`` (``make reference``) and committed, so the pages read the same in
the repository as on the site. The names: ``cli`` (every command's ``--help``),
``settings`` (every Settings field: its variable, type, default and description),
``errors`` (every rooted error with its CLI exit and HTTP status), ``client`` (the public
methods of both clients), ``fsm`` (the transition table) and ``http`` (the routes; the
OpenAPI document is added to the site). Written from the parser, the Settings model, the
error mappings and the table themselves, these pages cannot say something the code does
not do: ``tests/unit/test_docs.py`` fails when a committed page is not what the code
writes, and the MkDocs build (this module is its hook) writes the site from the code too.
"""

from __future__ import annotations

import argparse
import enum
import functools
import inspect
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BLOCK = re.compile(
    r"^(?P<start><!-- reference:(?P<name>\w+) -->\n)(?P<body>.*?)"
    r"(?P<end>^<!-- /reference:(?P=name) -->)$",
    re.M | re.S,
)
START = re.compile(r"^<!-- reference:\w+ -->$", re.M)


def fill(markdown: str, where: str = "a page") -> str:
    """``markdown`` with every reference block holding what the code writes now (an
    unknown name, or a start line without its end line, fails)."""

    def generate(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in GENERATORS:
            raise ValueError(f"{where}: unknown reference {name!r}")
        body = GENERATORS[name]().rstrip("\n") + "\n"
        return f"{match.group('start')}\n{body}\n{match.group('end')}"

    if not START.search(markdown):
        return markdown
    _importable()
    filled = BLOCK.sub(generate, markdown)
    if len(START.findall(filled)) != len(BLOCK.findall(filled)):
        raise ValueError(f"{where}: a <!-- reference:NAME --> line without its end line")
    return filled


def pages() -> list[Path]:
    """The pages under docs/ that hold a reference block."""
    return sorted(p for p in DOCS.rglob("*.md") if START.search(p.read_text("utf-8")))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The site is written from the code as well (whatever a working copy holds)."""
    return fill(markdown, page.file.src_uri)


def on_files(files: Any, config: Any) -> Any:
    """Add the HTTP API's OpenAPI document to the site, as ``reference/openapi.json``."""
    from mkdocs.structure.files import File

    _importable()
    document = json.dumps(_openapi(), indent=2, sort_keys=True)
    files.append(File.generated(config, "reference/openapi.json", content=document))
    return files


def _importable() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def cell(text: str) -> str:
    """``text`` fit for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def first_paragraph(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


# -- the command line ------------------------------------------------------------------


def cli_reference() -> str:
    from tasks.cli.main import build_parser

    # argparse wraps help at $COLUMNS: fixed, so the page is the same on every machine.
    os.environ["COLUMNS"] = "100"
    parts = []
    for prog, parser in _parsers(build_parser()):
        depth = min(prog.count(" ") + 2, 4)
        parts.append(f"{'#' * depth} `{prog}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def _parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases once
                yield from _parsers(sub)


# -- settings --------------------------------------------------------------------------


def settings_reference() -> str:
    from config import Settings
    from config.settings import variable_of

    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        variable = f"`{variable_of(name)}`"
        description = field.description or ""
        rows.append(
            f"| {variable} | {cell(_type_name(field.annotation))} | "
            f"{cell(_default(field.default))} | {cell(description)} |"
        )
    return "\n".join(rows) + "\n"


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " or ".join(f"`{member.value}`" for member in annotation)
    return {str: "text", int: "integer", float: "number", bool: "`true` or `false`"}.get(
        annotation, str(annotation)
    )


def _default(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "(none)"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


# -- errors ----------------------------------------------------------------------------


def errors_reference() -> str:
    from state import errors
    from tasks.cli.support import failure_of
    from tasks.server.errors import status_of

    rows = [
        "| error | is a | CLI exit (`kind`) | HTTP status (`kind`) | meaning |",
        "|---|---|---|---|---|",
    ]
    for cls in _error_classes(errors):
        exc = cls.__new__(cls)
        failure = failure_of(exc)
        status, kind = status_of(exc)
        if failure is None and status == 500:
            # Neither the CLI nor the service expects it: it ends a turn or fails a step
            # inside a worker, where the app reads it as metadata.last_error or an error.
            exit_ = http = "(inside workers)"
        else:
            exit_ = f"{failure.status} (`{failure.kind}`)" if failure else "1 (`failure`)"
            http = f"{status} (`{kind}`)"
        parent = cls.__mro__[1].__name__ if cls is not errors.AgentStateError else "Exception"
        rows.append(
            f"| `{cls.__name__}` | `{parent}` | {exit_} | {http} | {cell(first_paragraph(cls))} |"
        )
    return "\n".join(rows) + "\n"


def _error_classes(module: Any) -> list[type[BaseException]]:
    """The rooted errors of ``module``, the root first, each followed by its subclasses."""
    root = module.AgentStateError
    found = {
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, root)
        and value.__module__ == module.__name__
    }
    ordered: list[type[BaseException]] = []

    def visit(cls: type[BaseException]) -> None:
        ordered.append(cls)
        for child in sorted(found, key=lambda c: c.__name__):
            if child.__mro__[1] is cls and child not in ordered:
                visit(child)

    visit(root)
    return ordered + sorted(found - set(ordered), key=lambda c: c.__name__)


# -- the Python client -----------------------------------------------------------------


def client_reference() -> str:
    from tasks.client import AgentClient, AsyncAgentClient

    parts = []
    for cls in (AgentClient, AsyncAgentClient):
        parts.append(f"## `{cls.__name__}`\n\n{inspect.getdoc(cls) or ''}\n")
        for name, member in _public_methods(cls):
            signature = _signature(member)
            prefix = "async def" if inspect.iscoroutinefunction(member) else "def"
            doc = inspect.getdoc(member) or ""
            parts.append(f"### `{name}`\n\n```python\n{prefix} {name}{signature}\n```\n\n{doc}\n")
    return "\n".join(parts)


def _public_methods(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    for name in sorted(dir(cls)):
        member = getattr(cls, name)
        if name.startswith("_") or not callable(member) or isinstance(member, type):
            continue
        yield name, member


def _signature(member: Callable[..., Any]) -> str:
    """``(a: int, b: str = 'x') -> R`` as written in the source (annotations are strings
    there), one parameter per line when it would not fit on one."""
    try:
        signature = inspect.signature(member)
    except (TypeError, ValueError):
        return "(...)"
    parts = []
    starred = False
    for parameter in signature.parameters.values():
        if parameter.name == "self":
            continue
        if parameter.kind is parameter.KEYWORD_ONLY and not starred:
            parts.append("*")  # what follows is keyword-only
        starred = starred or parameter.kind in (parameter.KEYWORD_ONLY, parameter.VAR_POSITIONAL)
        text = parameter.name
        if parameter.kind is parameter.VAR_POSITIONAL:
            text = f"*{text}"
        elif parameter.kind is parameter.VAR_KEYWORD:
            text = f"**{text}"
        if parameter.annotation is not parameter.empty:
            text += f": {_annotation(parameter.annotation)}"
        if parameter.default is not parameter.empty:
            text += f" = {parameter.default!r}"
        parts.append(text)
    returns = signature.return_annotation
    tail = "" if returns is signature.empty else f" -> {_annotation(returns)}"
    one_line = f"({', '.join(parts)}){tail}"
    if len(one_line) <= 72:
        return one_line
    return "(\n" + "".join(f"    {part},\n" for part in parts) + f"){tail}"


def _annotation(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


# -- the HTTP API ----------------------------------------------------------------------


@functools.cache
def _openapi() -> dict[str, Any]:
    from config import Settings
    from tasks.server.app import create_app

    with tempfile.TemporaryDirectory() as folder:
        # A throwaway database: the document depends on the routes only, never on data.
        settings = Settings(database_url=f"sqlite:///{folder}/openapi.db", auto_migrate=False)
        return create_app(settings).openapi()


def http_reference() -> str:
    rows = ["| method | path | what it does |", "|---|---|---|"]
    for path, operations in _openapi()["paths"].items():
        for method, operation in operations.items():
            summary = operation.get("summary", "")
            rows.append(f"| `{method.upper()}` | `{path}` | {cell(summary)} |")
    return "\n".join(rows) + "\n"


# -- the state machine -----------------------------------------------------------------


def fsm_reference() -> str:
    from state.agent import DEFAULT_TRIGGERS
    from state.machine import STATES, TRANSITIONS

    rows = ["| trigger | from | to |", "|---|---|---|"]
    for row in TRANSITIONS:
        source = row["source"]
        sources = "any phase" if source == "*" else ", ".join(f"`{s}`" for s in _list(source))
        default = " (default)" if row["trigger"] in DEFAULT_TRIGGERS.values() else ""
        rows.append(f"| `{row['trigger']}`{default} | {sources} | `{row['dest']}` |")
    phases = ", ".join(f"`{state}`" for state in STATES)
    return f"The phases: {phases}.\n\n" + "\n".join(rows) + "\n"


def _list(source: Any) -> list[str]:
    return list(source) if isinstance(source, list) else [str(source)]


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "settings": settings_reference,
    "errors": errors_reference,
    "client": client_reference,
    "fsm": fsm_reference,
    "http": http_reference,
}


def main() -> None:
    """Write every reference block of the docs from the code (``make reference``)."""
    for path in pages():
        text = path.read_text("utf-8")
        filled = fill(text, str(path.relative_to(ROOT)))
        if filled != text:
            path.write_text(filled, "utf-8")
            print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
