"""Every complete Python program in the README and the docs pages runs, as the site shows
it, against real workers running the reference agent; the quick start prints what its
comments say. (Examples included from ``examples/`` run in test_examples.py and
test_events.py; fragments only compile: tests/unit/test_docs.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings
from tasks.worker import processes
from tests.api_support import new_keys, serving
from tests.docs_blocks import REPO, SERVED, Block, blocks, complete_blocks
from tests.support import Workers, make_settings, settings_env, uid

pytestmark = pytest.mark.workers

BLOCKS = complete_blocks()


def blocks_of(page: str) -> list[str]:
    return [block.code for block in blocks() if block.page == page]


@pytest.fixture(scope="module")
def settings(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    # The defaults a reader has: the reference agent and the built-in actions.
    settings = make_settings(pg_url, queue=uid("q"))
    pool = Workers(settings, tmp_path_factory.mktemp("docs"), count=1).start()
    yield settings
    pool.stop()


def _run(settings: Settings, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_quickstart_prints_what_it_says(settings: Settings, tmp_path: Path) -> None:
    result = _run(settings, [str(REPO / "examples" / "quickstart.py")], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["12*7 = 84", "success {'value': 50}"]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page}:{b.first_line}" for b in BLOCKS])
def test_every_complete_program_in_the_docs_runs(
    settings: Settings, block: Block, tmp_path: Path
) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code)
    result = _run(settings, [str(script)], tmp_path)
    assert result.returncode == 0, f"{block.page}: {block.first_line}\n{result.stderr}"


def test_getting_started_own_agent_action_and_workflow_as_the_page_says(
    pg_url: str, tmp_path: Path
) -> None:
    # The files the page tells a newcomer to save, as the page shows them, in a folder of
    # their own; the commands the page gives, run there with workers started there.
    page = (REPO / "docs" / "getting-started.md").read_text()
    (agent_block,) = [b for b in blocks_of("docs/getting-started.md") if "def generating" in b]
    (actions_block,) = [b for b in blocks_of("docs/getting-started.md") if "@action" in b]
    (tmp_path / "shout_agent.py").write_text(agent_block)
    (tmp_path / "text_actions.py").write_text(actions_block)
    spec = page.split("```json\n", 1)[1].split("```", 1)[0]
    (tmp_path / "spec.json").write_text(spec)
    commands = [line.split("  #")[0].strip() for line in page.splitlines()]
    send = next(c for c in commands if c.startswith("agentstate send s-2"))
    run = next(c for c in commands if "agentstate workflow run spec.json" in c)

    settings = make_settings(
        pg_url, queue=uid("q"), agent="shout_agent", action_modules="text_actions"
    )
    env = settings_env(settings)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `. .venv/bin/activate`
    pool = processes.WorkerGroup(settings, tmp_path, count=1, cwd=tmp_path).start()
    try:
        sent = subprocess.run(
            ["bash", "-c", send],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert sent.returncode == 0, sent.stderr
        assert "HELLO! (shout 1)" in sent.stdout
        ran = subprocess.run(
            ["bash", "-c", f"{run} --json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        workflow = json.loads(ran.stdout)
        assert workflow["status"] == "success"
        assert workflow["steps"]["total"]["outputs"] == {"words": 8}
    finally:
        pool.stop()


@pytest.mark.parametrize(
    "key", sorted(SERVED), ids=[f"{page}:{line}" for page, line in sorted(SERVED)]
)
def test_every_http_program_in_the_docs_runs_against_agentstate_serve(
    settings: Settings, key: tuple[str, str], tmp_path: Path
) -> None:
    (block,) = [b for b in blocks() if b.key == key]
    keys = new_keys("alice")
    with serving(settings, tmp_path, keys) as api:
        # The page's program, given the caller's key and pointed at this service.
        code = f"KEY = {keys['alice']!r}\n" + block.code.replace("http://127.0.0.1:8000", api.url)
        script = tmp_path / "example.py"
        script.write_text(code)
        result = _run(settings, [str(script)], tmp_path)
    assert result.returncode == 0, f"{block.page}: {block.first_line}\n{result.stderr}"
    assert "reply" in result.stdout


def test_the_fastapi_example_serves_through_its_lifespan(
    settings: Settings, tmp_path: Path
) -> None:
    """The async-client guide's FastAPI app, started and stopped as a server does (its
    lifespan), takes a message; FastAPI's deprecated hooks would fail it (-W error)."""
    (block,) = [b for b in BLOCKS if b.page.endswith("async-client.md") and "FastAPI(" in b.code]
    session_id = uid("fastapi")
    driver = f"""
from fastapi.testclient import TestClient

with TestClient(app) as http:
    answer = http.post(
        "/sessions/{session_id}/messages", json={{"text": "what is 6*7?", "user_id": "alice"}}
    )
    assert answer.status_code == 202, answer.text
print("served", answer.json()["message_id"])
"""
    script = tmp_path / "fastapi_app.py"
    script.write_text(block.code + driver)
    result = _run(settings, ["-W", "error::DeprecationWarning", str(script)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("served ")
