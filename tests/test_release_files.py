"""What a team checks before it adopts a package: a license (in the repository and in
the distribution's metadata), a changelog, and a version the command reports."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import metadata, version
from pathlib import Path
from typing import Any

from tasks.cli.support import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[1]
AGENTSTATE = str(Path(sys.executable).with_name("agentstate"))


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_license_is_mit_in_the_repository_and_the_metadata() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License")
    assert re.search(r"Copyright \(c\) \d{4} the agentstate developers", text)
    project = pyproject()["project"]
    assert project["license"] == "MIT"  # an SPDX expression (PEP 639)
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]
    installed = metadata(DISTRIBUTION)
    assert installed["License-Expression"] == "MIT"
    assert "LICENSE" in (installed.get_all("License-File") or [])


def test_the_distribution_is_not_named_after_another_project() -> None:
    # "agentstate" on PyPI is an unrelated project: ours installs as agentstate-celery,
    # and its command and import packages keep their names.
    project = pyproject()["project"]
    assert project["name"] == DISTRIBUTION == "agentstate-celery"
    assert project["scripts"] == {"agentstate": "tasks.cli:main"}
    extras = [d for d in project["optional-dependencies"]["dev"] if "[" in d]
    assert all(d.startswith(f"{DISTRIBUTION}[") for d in extras), extras
    assert f"via {DISTRIBUTION} (pyproject.toml)" in (ROOT / "requirements.lock").read_text()


def test_agentstate_version_prints_the_installed_version() -> None:
    result = subprocess.run(
        [AGENTSTATE, "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    expected = pyproject()["project"]["version"]
    assert version(DISTRIBUTION) == expected
    assert result.stdout.strip() == f"agentstate {expected} ({DISTRIBUTION})"


def test_the_changelog_keeps_an_unreleased_section_and_each_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert pyproject()["project"]["version"] in headings
    for heading in headings[1:]:
        assert re.search(rf"^## \[{re.escape(heading)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M)
