"""Private Redis and Postgres servers, a beat process and a chaos proxy for fault tests.

Fault tests flush, stop and restart servers. They do it to servers of their own, on
ports of their own, so that the machine's shared services (and a running demo) are
never disturbed.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import psycopg2
import redis

from config import Settings
from tasks.worker import processes
from tasks.worker.processes import free_port
from tests.support import REPO, settings_env

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), Path("/usr/bin"))


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


class PrivateRedis:
    """A redis-server of the test's own, without persistence (like the shared one)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="agentstate-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def url_for(self, user: str, password: str, db: int = 0) -> str:
        """A URL with credentials, percent-escaped as every valid URL must be."""
        return (
            f"redis://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{self.port}/{db}"
        )

    def require_passwords(self, default_password: str, users: dict[str, str]) -> None:
        """ACL users with full rights, then ``requirepass`` for the default user."""
        client = redis.Redis.from_url(self.url)
        for user, password in users.items():
            # One bulk string per rule: any character works, spaces included.
            client.execute_command(
                "ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all"
            )
        client.config_set("requirepass", default_password)
        client.close()

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def flushall(self) -> None:
        redis.Redis.from_url(self.url).flushall()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (initdb in a temp dir). TCP connections use
    ``host_auth`` (trust by default, or e.g. scram-sha-256); the Unix socket trusts."""

    def __init__(self, host_auth: str = "trust") -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="agentstate-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.host_auth = host_auth

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, user: str, password: str, database: str) -> str:
        """A TCP URL with credentials, percent-escaped as every valid URL must be."""
        credentials = f"{quote(user, safe='')}:{quote(password, safe='')}"
        return f"postgresql+psycopg2://{credentials}@127.0.0.1:{self.port}/{database}"

    def create_owner(self, user: str, password: str, database: str) -> None:
        """A login role with ``password`` that owns a new ``database`` (via the socket)."""
        conn = psycopg2.connect(host=str(self.root), port=self.port, user="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            # psycopg2 quotes the password client-side: any character is safe here.
            cur.execute(f'CREATE ROLE "{user}" LOGIN PASSWORD %s', (password,))
            cur.execute(f'CREATE DATABASE "{database}" OWNER "{user}"')
        conn.close()

    def _run(self, *args: str) -> None:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if os.geteuid() == 0:  # the server refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> PrivatePostgres:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        if not self.data.exists():
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "--auth-local=trust",
                f"--auth-host={self.host_auth}",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            )
        self._ctl("start")
        return self

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", *extra, action
        )

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._ctl("stop", "-m", "immediate")

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class Beat:
    """`celery -A tasks beat`, so the periodic recovery sweep runs for real."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Beat:
        env = settings_env(self.settings)
        self.proc = processes.start_beat(self.settings, self.log_dir, cwd=REPO, env=env)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop([self.proc], timeout_s=10)


# The hot path's one-statement writes run in autocommit: each is its own commit.
_AUTOCOMMIT_WRITES = (
    b"EXECUTE agentstate_commit_",
    b"EXECUTE agentstate_accept_",
    b"EXECUTE agentstate_claim_",
    b"EXECUTE agentstate_succeed_",
)


def _commits(query: bytes) -> bool:
    """Whether a simple-query message commits: a COMMIT, or one of the prepared writes
    sent in autocommit (a turn's last commit and its inbox check travel as one)."""
    text = query.rstrip(b"\0").strip()
    return text.upper() == b"COMMIT" or text.startswith(_AUTOCOMMIT_WRITES)


class CommitDropper:
    """A TCP proxy in front of Postgres that, now and then, lets a commit through (a
    COMMIT, or a write in autocommit) and then cuts the connection before the server's
    answer reaches the client: the transaction is committed, but the client sees a lost
    connection (the ambiguous-commit fault)."""

    def __init__(self, upstream_port: int, probability: float, seed: int = 7) -> None:
        self.upstream_port = upstream_port
        self.probability = probability
        self.random = random.Random(seed)
        self.port = free_port()
        self.dropped = 0
        self.commits = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            cut = threading.Event()
            threading.Thread(
                target=self._client_to_server, args=(client, upstream, cut), daemon=True
            ).start()
            threading.Thread(
                target=self._server_to_client, args=(upstream, client, cut), daemon=True
            ).start()

    def _decide(self) -> bool:
        with self._lock:
            self.commits += 1
            drop = self.random.random() < self.probability
            self.dropped += drop
            return drop

    def _client_to_server(
        self, client: socket.socket, upstream: socket.socket, cut: threading.Event
    ) -> None:
        try:
            self._startup(client, upstream)
            while True:
                header = _read_exact(client, 5)
                payload = _read_exact(client, int.from_bytes(header[1:5], "big") - 4)
                if header[:1] == b"Q" and _commits(payload) and self._decide():
                    cut.set()  # the server's answer to this COMMIT is swallowed
                upstream.sendall(header + payload)
        except OSError:
            pass
        finally:
            _close(client, upstream)

    def _startup(self, client: socket.socket, upstream: socket.socket) -> None:
        # SSL/GSS requests come before the startup packet; all of them are untyped.
        while True:
            length = _read_exact(client, 4)
            body = _read_exact(client, int.from_bytes(length, "big") - 4)
            upstream.sendall(length + body)  # the server's 'N' (no SSL) flows back by itself
            if int.from_bytes(body[:4], "big") not in (80877103, 80877104):
                return

    def _server_to_client(
        self, upstream: socket.socket, client: socket.socket, cut: threading.Event
    ) -> None:
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    return
                if cut.is_set():
                    return  # the COMMIT was applied; its acknowledgement is lost
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, upstream)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return buf


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
