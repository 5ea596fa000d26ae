"""Errors that teach at start: `celery -A tasks worker|beat|flower` with a bad setting, and
a worker whose agent misspells a phase, each stop with one line that says what to fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config import Settings, child_environment
from tests.support import make_settings, uid

pytestmark = pytest.mark.workers
CELERY = str(Path(sys.executable).with_name("celery"))
TYPO_AGENT = """
from state.agent import PhaseContext, PhaseResult


def generatng(ctx: PhaseContext) -> PhaseResult:
    return PhaseResult("response_sent", reply="never used")
"""


def run_celery(
    settings: Settings, cwd: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    environment = child_environment(settings)
    environment.pop("PYTHONPATH", None)
    environment.update(env)
    return subprocess.run(
        [CELERY, "-A", "tasks", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert len(output.splitlines()) == 1, output
    for word in words:
        assert word in output, output


@pytest.mark.parametrize(
    "program",
    [
        ["worker", "--concurrency=1", "--without-mingle", "--without-gossip"],
        ["beat"],
        ["flower", "--port=1", "--address=127.0.0.1"],  # refused before it would listen
    ],
    ids=["worker", "beat", "flower"],
)
def test_a_bad_setting_stops_celery_with_one_line_naming_the_variable(
    pg_url: str, tmp_path: Path, program: list[str]
) -> None:
    settings = make_settings(pg_url, queue=uid("q"))
    result = run_celery(settings, tmp_path, *program, AGENTSTATE_LOCK_TIMEOUT="abc")
    assert_one_line(result, "agentstate: error: bad setting AGENTSTATE_LOCK_TIMEOUT")


def test_a_worker_whose_agent_misspells_a_phase_refuses_to_start(
    pg_url: str, tmp_path: Path
) -> None:
    (tmp_path / "typo_agent.py").write_text(TYPO_AGENT)
    settings = make_settings(pg_url, queue=uid("q"), agent="typo_agent")
    result = run_celery(settings, tmp_path, "worker", "--concurrency=1", "--without-mingle")
    assert_one_line(
        result,
        "agent 'typo_agent' defines none of the phases understanding, planning,",
        "'generatng' is not a phase (did you mean 'generating'?)",
        "AGENTSTATE_AGENT",
    )
