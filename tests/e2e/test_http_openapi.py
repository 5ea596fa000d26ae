"""A property-based run of the service's own OpenAPI document (schemathesis): thousands
of generated requests, valid and not, against a real ``agentstate serve`` and real
workers; none may answer 5xx, and every answer must be one the document describes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings
from tests.api_support import Api, new_keys, serving
from tests.support import Workers

pytestmark = pytest.mark.workers

CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance"
EXAMPLES = 10  # per operation and phase: about a minute on a quiet machine
ERASURE = "/v1/users/{user_id}"


def schemathesis(api: Api, tmp: Path, *only_or_not: str) -> None:
    program = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert program, "schemathesis (the dev extra) is not installed"
    command = [
        program,
        "run",
        f"{api.url}/openapi.json",
        f"--checks={CHECKS}",
        f"--header=Authorization: Bearer {api.keys['*']}",
        f"--max-examples={EXAMPLES}",
        "--workers=1",
        "--generation-database=none",
        "--request-timeout=30",
        "--no-color",
        "--seed=20260101",
        *only_or_not,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTATE_")}
    result = subprocess.run(
        command, cwd=tmp, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


@pytest.fixture(scope="module")
def api(
    workers: Workers, worker_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    keys = new_keys("alice", "*")
    # Streams end within a second, so that a generated request to follow events does not
    # hold the run up.
    with serving(
        worker_settings,
        tmp_path_factory.mktemp("serve"),
        keys,
        AGENTSTATE_STREAM_MAX_SECONDS="1",
    ) as running:
        yield running


def test_no_generated_request_gets_a_5xx_or_an_undocumented_answer(
    api: Api, tmp_path: Path
) -> None:
    schemathesis(api, tmp_path, f"--exclude-path={ERASURE}")


def test_erasure_under_generated_requests(api: Api, tmp_path: Path) -> None:
    schemathesis(api, tmp_path, f"--include-path={ERASURE}")
