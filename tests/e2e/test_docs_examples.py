"""Every complete Python program in the README and the docs pages runs, as the site shows
it, against real workers running the reference agent; the quick start prints what its
comments say. (Examples included from ``examples/`` run in test_examples.py and
test_events.py; fragments only compile: tests/unit/test_docs.py.)"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from config import Settings
from tests.docs_blocks import REPO, Block, complete_blocks
from tests.support import Workers, make_settings, settings_env, uid

pytestmark = pytest.mark.workers

BLOCKS = complete_blocks()


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
