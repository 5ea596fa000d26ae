"""An app's own ``config.py``/``state.py``/``tasks.py`` next to its script
(docs/guides/agents.md, Module names): what the error says, and the layout that works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

IMPORT_CLIENT = "from tasks.client import AgentClient; print('imported')"


def run_python(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    # PYTHONPATH puts the repository after the current folder, as an installed package is.
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", ["config", "state"])
def test_an_app_module_hiding_config_or_state_is_named(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("DEBUG = True\n")
    result = run_python(tmp_path, "-c", IMPORT_CLIENT)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"ImportError: {tmp_path / name}.py hides agentstate's package {name!r} "
        f"({REPO / name}): an app module named {name!r} comes first on sys.path. Rename it "
        "or move it into your app's package (docs/guides/agents.md: Module names)"
    )


def test_a_worker_started_next_to_a_config_py_says_why_it_cannot_load(tmp_path: Path) -> None:
    (tmp_path / "config.py").write_text("DEBUG = True\n")
    result = run_python(tmp_path, "-m", "celery", "-A", "tasks", "worker")
    assert result.returncode != 0
    assert f"{tmp_path / 'config.py'} hides agentstate's package 'config'" in result.stderr


def test_an_app_tasks_py_gives_the_message_the_docs_quote(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text("def add(a, b):\n    return a + b\n")
    result = run_python(tmp_path, "-c", IMPORT_CLIENT)
    assert result.returncode == 1
    quoted = "No module named 'tasks.client'; 'tasks' is not a package"
    assert result.stderr.strip().splitlines()[-1] == f"ModuleNotFoundError: {quoted}"
    assert quoted in (REPO / "docs" / "guides" / "agents.md").read_text()


def test_the_app_as_a_package_keeps_its_own_tasks_and_config(tmp_path: Path) -> None:
    # The docs' layout: myapp/{__init__,app,tasks,config}.py, run as `python -m myapp.app`.
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text("def add(a, b):\n    return a + b\n")
    (app / "config.py").write_text("GREETING = 'hello'\n")
    (app / "app.py").write_text(
        "from tasks.client import AgentClient\n"
        "from myapp import config, tasks\n"
        "print(AgentClient.__module__, tasks.add(2, 3), config.GREETING)\n"
    )
    result = run_python(tmp_path, "-m", "myapp.app")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["tasks.client.agent", "5", "hello"]
