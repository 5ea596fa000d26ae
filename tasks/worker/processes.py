"""Starting and stopping real Celery processes: workers, beat and Flower, and the HTTP
service (``agentstate serve``).

The one place that launches ``celery -A tasks ...``; the demo, the tests and the
benchmarks all use it. Each process runs in its own process group, so stopping it also
stops a worker's pool children. Being in groups of their own, they do not get the
Ctrl-C of the terminal: every process started here and not stopped yet is stopped when
this process exits (atexit), and :func:`exit_on_sigterm` makes a SIGTERM an exit that
runs it, so an interrupted test run or demo leaves no worker behind.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path

from config import Settings, child_environment
from state.errors import ServiceUnavailableError

READY_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` right now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


STOP_TIMEOUT_S = 20.0
FLOWER_READY_TIMEOUT_S = 30.0


def celery_command(*args: str) -> list[str]:
    """``celery -A tasks <args>`` run by this interpreter."""
    return [sys.executable, "-m", "celery", "-A", "tasks", *args]


def spawn(
    args: list[str],
    env: dict[str, str],
    log: Path | None,
    cwd: Path | None = None,
    launcher: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start ``celery -A tasks <args>`` in a process group of its own, logging to ``log``
    (``launcher``: a command that execs it, e.g. ``ip netns exec NAME``)."""
    return launch([*launcher, *celery_command(*args)], env, log, cwd)


def launch(
    command: list[str], env: dict[str, str], log: Path | None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a process group of its own, its output appended to ``log``."""
    out = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    _started[proc.pid] = proc
    return proc


# Every process spawn() started and stop() has not stopped yet, by pid.
_started: dict[int, subprocess.Popen[bytes]] = {}


def stop_all(timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop every process this process started here and did not stop (run at exit)."""
    stop(list(_started.values()), timeout_s)


def exit_on_sigterm() -> None:
    """Make SIGTERM end this process as Ctrl-C does (KeyboardInterrupt): cleanup code
    runs (pytest's fixture teardowns, ``finally`` blocks, :func:`stop_all` at exit)
    instead of the process vanishing with its workers left running. Only from the main
    thread, and only over the default handler (an app's own handler is kept)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


atexit.register(stop_all)


def answers(proc: subprocess.Popen[bytes], url: str, timeout_s: float, pause: float = 0.2) -> bool:
    """Wait until ``url`` answers while ``proc`` runs; False if it did not in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(url, timeout=1).read()  # noqa: S310
            return True
        except OSError:
            time.sleep(pause)
    return False


def stop(procs: list[subprocess.Popen[bytes]], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Warm shutdown of each process group, then a kill for what does not stop in time."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _started.pop(proc.pid, None)


def start_beat(
    settings: Settings, log_dir: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``celery -A tasks beat`` with its schedule file in ``log_dir``."""
    args = ["beat", "--loglevel=INFO", f"--schedule={log_dir / 'beat-schedule'}"]
    return spawn(args, env or child_environment(settings), log_dir / "beat.log", cwd)


class Flower:
    """``celery -A tasks flower`` on 127.0.0.1:``port``."""

    def __init__(
        self,
        settings: Settings,
        port: int,
        *,
        log: Path | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        basic_auth: str | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        args = ["flower", f"--port={port}", "--address=127.0.0.1"]
        if basic_auth:
            args.append(f"--basic_auth={basic_auth}")
        self.proc = spawn(args, env or child_environment(settings), log, cwd)

    def wait_ready(self, timeout_s: float = FLOWER_READY_TIMEOUT_S) -> bool:
        """Wait until Flower answers its health check; False if it did not in time."""
        return answers(self.proc, f"{self.url}/healthcheck", timeout_s)

    def stop(self) -> None:
        """Stop Flower."""
        stop([self.proc])


class ApiServer:
    """``agentstate serve`` on 127.0.0.1:``port`` (the HTTP API and the console)."""

    def __init__(
        self,
        settings: Settings,
        port: int,
        *,
        log: Path | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "tasks.cli", "serve", "--port", str(port)]
        self.proc = launch(command, env or child_environment(settings), log, cwd)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Wait until it answers ``/healthz``; False if it did not in time (or exited)."""
        return answers(self.proc, f"{self.url}/healthz", timeout_s, pause=0.1)

    def stop(self) -> int:
        """SIGTERM, as a supervisor stops it; return its exit status."""
        stop([self.proc])
        return int(self.proc.returncode)


class WorkerGroup:
    """``celery -A tasks worker`` processes sharing one Settings."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        *,
        count: int = 2,
        concurrency: int = 1,
        pool: str = "prefork",
        cwd: Path | None = None,
        extra_env: dict[str, str] | None = None,
        loglevel: str = "INFO",
        launcher: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.count = count
        self.concurrency = concurrency
        self.pool = pool
        self.cwd = cwd
        self.env = {**child_environment(settings), **(extra_env or {})}
        self.loglevel = loglevel
        self.launcher = tuple(launcher)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tag = uuid.uuid4().hex[:6]

    def start(self) -> WorkerGroup:
        """Start ``count`` workers and wait until each answers a ping."""
        for _ in range(self.count):
            self.add()
        self.wait_ready()
        return self

    def add(self) -> str:
        """Start one more worker; return its node name."""
        name = f"w{len(self.procs) + 1}-{self.tag}@localhost"
        args = [
            "worker",
            f"--hostname={name}",
            f"--concurrency={self.concurrency}",
            f"--pool={self.pool}",
            f"--loglevel={self.loglevel}",
            "--without-mingle",
            "--without-gossip",
        ]
        log = self.log_dir / f"{name.split('@', maxsplit=1)[0]}.log"
        self.procs[name] = spawn(args, self.env, log, self.cwd, self.launcher)
        return name

    def alive(self) -> list[str]:
        """Node names of workers whose main process is running."""
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Block until every live worker answers a ping."""
        from tasks.app import make_app

        app = make_app(self.settings)
        with app.connection_for_write() as conn:  # lazy: names the transport's errors only
            broker_errors = (OSError, *conn.connection_errors, *conn.channel_errors)
        wanted = set(self.alive())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(self.procs[name].poll() is not None for name in wanted):
                raise ServiceUnavailableError(
                    f"a worker exited at start; see the logs in {self.log_dir}"
                )
            try:
                replies = app.control.ping(destination=sorted(wanted), timeout=0.5) or []
            except broker_errors:
                # A broker busy with other clients (RabbitMQ under load) may reset the
                # connection while workers come up: the ping is asked again, on a new one.
                app.close()
                time.sleep(0.2)
                continue
            if wanted <= {name for reply in replies for name in reply}:
                return
        raise TimeoutError(f"workers {sorted(wanted)} not ready; logs in {self.log_dir}")

    def pids(self) -> list[int]:
        """Main processes and their pool children."""
        pids = []
        for proc in self.procs.values():
            if proc.poll() is None:
                pids.append(proc.pid)
                pids.extend(self.children_of(proc.pid))
        return pids

    @staticmethod
    def children_of(pid: int) -> list[int]:
        """Direct children of a process."""
        try:
            text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        except OSError:
            return []
        return [int(child) for child in text.split()]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a worker's whole process group (main process and pool children)."""
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            if sig == signal.SIGKILL:
                proc.wait(timeout=10)

    def stop(self) -> None:
        """Warm shutdown, then a kill for whatever does not stop in time."""
        stop(list(self.procs.values()))

    def logs(self) -> str:
        """The tail of every worker's log."""
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.log_dir.glob("*.log"))
