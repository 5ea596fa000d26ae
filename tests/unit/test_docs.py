"""The docs say what the code does: every setting is described, every example is Python
that either runs in the e2e tests or is an acknowledged fragment, every test a guarantee
names exists, and the reference pages the site generates cover everything."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from types import ModuleType

import pytest

from config import Settings
from config.settings import variable_of
from state import errors
from tests.docs_blocks import (
    FRAGMENTS,
    NOT_RUN,
    PAGES,
    REPO,
    SERVED,
    blocks,
    complete_blocks,
    undefined_names,
    written,
)


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook", REPO / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_has_a_description(name: str) -> None:
    # The settings page is written from these: a field without one would be a blank row.
    description = Settings.model_fields[name].description
    assert description and len(description.split()) >= 3, f"AGENTSTATE_{name.upper()}"


def test_every_block_is_python_and_every_fragment_is_one_the_docs_meant() -> None:
    for block in blocks():
        ast.parse(block.code, filename=block.page)  # raises on anything that is not Python
    keys = {block.key for block in blocks()}
    listed = FRAGMENTS | NOT_RUN | SERVED
    assert keys >= listed, listed - keys  # none gone stale
    for block in complete_blocks():
        assert not undefined_names(block.code), (
            f"{block.page}: {block.first_line!r} uses {undefined_names(block.code)} without "
            "defining them: make it whole (the e2e tests run it) or list it in FRAGMENTS"
        )
    for block in (b for b in blocks() if b.key in SERVED):
        assert undefined_names(block.code) == ["KEY"], block.key


def test_the_examples_are_included_from_their_files_and_the_readme_quotes_the_quickstart() -> None:
    included = {spec.split(":")[0] for block in blocks() for spec in block.includes}
    assert included >= {
        "examples/quickstart.py",
        "examples/shout_agent.py",
        "examples/text_actions.py",
        "examples/follow_events.py",
        "examples/time_travel.py",
        "examples/refund_agent.py",
    }
    # The approval pattern comes first in the approvals guide, before the reference.
    approvals = (REPO / "docs/guides/approvals.md").read_text()
    assert approvals.index("examples/refund_agent.py") < approvals.index("## Asking and deciding")
    # GitHub shows the README without includes: its quick start is the file's, verbatim.
    (quickstart,) = [b for b in blocks() if b.page == "README.md"]
    body = (REPO / "examples/quickstart.py").read_text().split('"""', 2)[2]
    assert quickstart.code.strip() == body.strip()


def test_every_test_a_guarantee_names_exists() -> None:
    page = (REPO / "docs/concepts/guarantees.md").read_text()
    named = 0
    for row in (line for line in page.splitlines() if line.startswith("| ")):
        current = None
        for ref in re.findall(r"`((?:tests/[\w/]+\.py)?(?:::\w+)?)`", row):
            path, _, test = ref.partition("::")
            current = REPO / path if path else current
            assert current is not None and current.exists(), ref
            if test:
                assert re.search(rf"^(async )?def {test}\(", current.read_text(), re.M), ref
            named += 1
    assert named > 100


def test_the_reference_pages_cover_every_command_error_and_route() -> None:
    hook = _hook()
    cli = hook.cli_reference()
    for command in ("agentstate send", "agentstate session fork", "agentstate approval approve"):
        assert f"`{command}`" in cli
    error_page = hook.errors_reference()
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.AgentStateError):
            assert f"`{value.__name__}`" in error_page
    assert "| `NotFoundError` | `BadInputError` | 2 (`not_found`) | 404 (`not_found`)" in error_page
    settings_page = hook.settings_reference()
    for name in Settings.model_fields:
        assert f"`{variable_of(name)}`" in settings_page
    assert "| `GET` | `/v1/sessions/{session_id}` |" in hook.http_reference()
    assert "`need_approval`" in hook.fsm_reference()
    client = hook.client_reference()
    assert "### `send_message`" in client and "async def send_message" in client


def test_the_committed_reference_pages_are_what_the_code_writes() -> None:
    # Read in the repository (GitHub, an editor) as on the site: a page the code no longer
    # matches is stale. `make reference` rewrites them.
    hook = _hook()
    pages = {path.relative_to(REPO).as_posix() for path in hook.pages()}
    assert pages >= {
        "docs/reference/settings.md",
        "docs/reference/cli.md",
        "docs/reference/errors.md",
        "docs/reference/client.md",
        "docs/reference/http.md",
    }
    for name in sorted(pages):
        text = (REPO / name).read_text()
        assert hook.fill(text, name) == text, f"{name} is stale: run `make reference`"
    settings_page = (REPO / "docs/reference/settings.md").read_text()
    for variable in ("AGENTSTATE_REDIS_URL", "AGENTSTATE_DATABASE_URL"):
        assert f"| `{variable}` | text |" in settings_page


def test_the_first_steps_name_the_two_urls() -> None:
    # A newcomer's services are rarely the defaults: the first step says where to point.
    readme = (REPO / "README.md").read_text()
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    first_step = (REPO / "docs/getting-started.md").read_text().split("## 2.", 1)[0]
    for text in (install, first_step):
        for variable in ("AGENTSTATE_REDIS_URL", "AGENTSTATE_DATABASE_URL"):
            assert f"export {variable}=" in text, variable
        assert "reference/settings.md" in text


def test_every_link_of_the_readme_reaches_a_file() -> None:
    # The README is not part of the site, so the strict build does not check its links.
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert len(local) > 20
    for link in local:
        assert (REPO / link).exists(), link


def _command_lines() -> list[tuple[str, list[str]]]:
    """Each ``agentstate ...`` command the README and the docs show, as its words: the lines
    of their shell blocks, and their inline code (a placeholder N or S stands for 1)."""
    found = []
    for page in PAGES:
        text = written(page)
        lines = [
            line.strip().removeprefix("$ ")
            for block in re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, re.S)
            for line in block.replace("\\\n", " ").splitlines()
        ]
        lines += re.findall(r"`(agentstate [^`\n]+)`", text)
        for line in lines:
            if re.search(r"\[|\||\.\.\.", line):
                continue  # a synopsis (`[--all]`, `approve|reject`), not a command
            words = shlex.split(line.split("&&")[0], comments=True)
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words.pop(0)  # VARIABLE=value before the command
            if words[:1] == ["agentstate"] and not {"--help", "--version"} & set(words):
                found.append((page.name, ["1" if w in ("N", "S") else w for w in words[1:]]))
    return found


def test_every_command_the_docs_show_is_one_the_cli_accepts() -> None:
    from tasks.cli.main import build_parser

    parser = build_parser()
    commands = _command_lines()
    assert len(commands) > 20
    for page, words in commands:
        try:
            parser.parse_args(words)
        except Exception as exc:  # the parser's UsageError says what is wrong
            raise AssertionError(f"{page}: agentstate {shlex.join(words)}: {exc}") from exc
