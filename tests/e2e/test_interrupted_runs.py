"""An interrupted test run (Ctrl-C's SIGINT, or SIGTERM from CI or a timeout) leaves no
Celery worker behind: a small pytest run that starts workers, the careful way (a fixture
that stops them) and the careless way (started, never stopped), is interrupted, and none
of its worker processes, main or pool child, is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.workers
INNER = """
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from state.storage.db import get_engine, upgrade_schema
from tests.support import Workers, make_settings, uid


@pytest.fixture(scope="module")
def careful(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'agentstate.db'}"
    upgrade_schema(get_engine(url))
    pool = Workers(make_settings(url, queue=uid("q")), tmp_path_factory.mktemp("careful"))
    yield pool.start()
    pool.stop()


def test_held_until_interrupted(careful: Workers, tmp_path: Path) -> None:
    careless = Workers(careful.settings, tmp_path, count=1).start()  # never stopped
    pids = careful.pids() + careless.pids()
    Path(os.environ["WORKER_PIDS_FILE"]).write_text(" ".join(map(str, pids)))
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has stopped; only its parent's wait is missing


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_stops_every_worker_it_started(
    tmp_path: Path, sig: signal.Signals
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    pids_file = tmp_path / "pids"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "WORKER_PIDS_FILE": str(pids_file),
    }
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-o", "timeout=0", str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not pids_file.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pids_file.exists(), (run.stdout.read() if run.stdout else b"").decode()[-3000:]
        pids = [int(pid) for pid in pids_file.read_text().split()]
        assert len(pids) >= 6 and all(alive(pid) for pid in pids)  # 3 workers, 3 children
        run.send_signal(sig)
        output, _ = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:  # do not leak them into the rest of the suite either
        os.kill(pid, signal.SIGKILL)
    assert not left, output.decode(errors="replace")[-3000:]
