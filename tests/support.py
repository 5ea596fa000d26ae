"""Test helpers: service endpoints, settings, unique ids and real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, text

from config import Settings

REPO = Path(__file__).resolve().parents[1]
IN_CI = bool(os.environ.get("CI"))
TEST_DB = os.environ.get("AGENTSTATE_TEST_DB_NAME", "agentstate_test")
PG_SERVER = os.environ.get(
    "AGENTSTATE_TEST_PG_SERVER", "postgresql+psycopg2://postgres@127.0.0.1:5432"
)
PG_URL = f"{PG_SERVER}/{TEST_DB}"
REDIS_URL = os.environ.get("AGENTSTATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
BROKER_URL = os.environ.get("AGENTSTATE_TEST_BROKER_URL", "redis://127.0.0.1:6379/14")
WORKER_START_TIMEOUT_S = 60.0


def unavailable(what: str) -> None:
    """Skip locally when a service is missing; fail in CI (CI must test everything)."""
    if IN_CI:
        pytest.fail(f"{what} is not reachable, and CI requires it")
    pytest.skip(f"{what} is not reachable")


def redis_ok(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def postgres_ok() -> bool:
    try:
        engine = create_engine(f"{PG_SERVER}/postgres")
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


def recreate_database(name: str) -> None:
    engine = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()


def drop_database(name: str) -> None:
    engine = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def uid(prefix: str = "t") -> str:
    """A fresh id for one test's sessions, users and workflows."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for tests: their own Redis DB indexes and database."""
    values: dict[str, Any] = {
        "redis_url": REDIS_URL,
        "broker_url": BROKER_URL,
        "database_url": database_url,
        "auto_migrate": False,
    }
    values.update(overrides)
    return Settings(**values)


def settings_env(settings: Settings) -> dict[str, str]:
    """The AGENTSTATE_* environment that reproduces ``settings`` in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTATE_")}
    for name, value in settings.model_dump().items():
        env[f"AGENTSTATE_{name.upper()}"] = str(value.value if hasattr(value, "value") else value)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


class Workers:
    """Real ``celery -A tasks worker`` processes for one test (or module)."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        *,
        count: int = 2,
        concurrency: int = 1,
        pool: str = "prefork",
    ) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.count = count
        self.concurrency = concurrency
        self.pool = pool
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tag = uuid.uuid4().hex[:6]

    def start(self) -> Workers:
        for _ in range(self.count):
            self.add()
        self.wait_ready()
        return self

    def add(self) -> str:
        """Start one more worker; return its node name."""
        name = f"w{len(self.procs) + 1}-{self.tag}@localhost"
        log = (self.log_dir / f"{name.split('@', maxsplit=1)[0]}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tasks",
                "worker",
                f"--hostname={name}",
                f"--concurrency={self.concurrency}",
                f"--pool={self.pool}",
                "--loglevel=INFO",
                "--without-mingle",
                "--without-gossip",
            ],
            cwd=REPO,
            env=settings_env(self.settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return name

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def wait_ready(self, timeout: float = WORKER_START_TIMEOUT_S) -> None:
        from tasks.app import make_app

        app = make_app(self.settings)
        deadline = time.monotonic() + timeout
        wanted = set(self.alive())
        while time.monotonic() < deadline:
            replies = app.control.ping(destination=sorted(wanted), timeout=0.5) or []
            answered = {name for reply in replies for name in reply}
            if wanted <= answered:
                return
        raise TimeoutError(f"workers {sorted(wanted)} not ready; logs in {self.log_dir}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a worker's whole process group (main process and pool children)."""
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            if sig == signal.SIGKILL:
                proc.wait(timeout=10)

    def children(self, name: str) -> list[int]:
        """PIDs of a worker's pool processes."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.procs[name].pid)], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in out.stdout.split()]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.log_dir.glob("*.log"))
