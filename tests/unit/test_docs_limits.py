"""The docs document every limit with its default and what happens at it, what is trusted,
and an app example that scopes its reads (every setting's description: test_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from config import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"
LIMITS = [
    name
    for name in Settings.model_fields
    if name.startswith("max_") or name in ("phase_time_limit", "execution_timeout")
]


def _page(path: str) -> str:
    return (DOCS / path).read_text(encoding="utf-8")


def _rows(section: str) -> dict[str, list[str]]:
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `AGENTSTATE_"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


@pytest.mark.parametrize("name", LIMITS)
def test_every_limit_is_in_the_limits_table_with_its_default(name: str) -> None:
    row = _rows(_page("operations/limits.md")).get(f"AGENTSTATE_{name.upper()}")
    assert row is not None, name
    default, at_the_limit = row
    number = re.match(r"`([\d.]+)`", default)
    assert number is not None and float(number.group(1)) == Settings.model_fields[name].default
    assert len(at_the_limit) > 20  # says what happens


def test_the_security_section_says_what_is_trusted_and_what_is_not() -> None:
    security = _page("operations/security.md")
    for words in ("**Trusted**", "**Not trusted**", "Forged broker messages", "Passwords"):
        assert words in security


def test_the_flask_example_scopes_reads_and_maps_errors() -> None:
    page = _page("guides/apps.md")
    start = page.index("```python\nfrom flask import") + len("```python\n")
    example = page[start : page.index("```", start)]
    compile(example, "apps.md", "exec")  # at least it is Python
    reads = example.split("def get_session", 1)[1]
    assert "user_id=" in reads and "history_limit=" in reads
    assert "@app.errorhandler(NotFoundError)" in example and "404" in example
    assert "@app.errorhandler(BadInputError)" in example and "400" in example
    assert "not text.strip()" in example
