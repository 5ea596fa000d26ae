"""Production-shaped services for tests: PgBouncer in transaction mode, a Redis primary
with a replica and three Sentinels, and a RabbitMQ virtual host of the tests' own.

Each runs on free ports of its own (or a vhost of its own) and is stopped by the test
that started it; the machine's shared services are never reconfigured.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import redis

from tasks.worker.processes import free_port
from tests.services import wait_for_port
from tests.support import PG_SERVER, per_worker, unavailable

AMQP_URL = per_worker(
    os.environ.get("AGENTSTATE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/agentstate_test")
)
SENTINEL_SERVICE = "agentstate"
APT_LOCK = Path(tempfile.gettempdir()) / "agentstate-tests-apt.lock"
VHOST_START_TIMEOUT_S = 15.0


def ensure_program(program: str, package: str) -> str:
    """The path of ``program``, installing Debian's ``package`` with apt-get if missing
    (as the CI machine's root); skips locally and fails in CI when it cannot."""
    found = _which(program)
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        # One install at a time: the test processes of one run (xdist) share dpkg's lock.
        with open(APT_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            found = _which(program)  # another process may have installed it meanwhile
            if found is None:
                _apt_install(package)
                found = _which(program)
    if found is None:
        unavailable(f"{program} (Debian package {package})")
    assert found is not None
    return found


def install_packages(packages: list[str]) -> None:
    """Install Debian ``packages`` in one apt-get run, under the tests' apt lock (the
    background install that tests/scheduling.py starts at the beginning of a run)."""
    with open(APT_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _apt_install(*packages)


def _which(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")


def _apt_install(*packages: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    update = ["apt-get", "update", "-qq"]
    subprocess.run(update, check=False, env=env, capture_output=True, timeout=300)
    install = ["apt-get", "install", "-y", "-qq", *packages]
    subprocess.run(install, check=False, env=env, capture_output=True, timeout=600)


class PgBouncer:
    """PgBouncer in transaction mode in front of the tests' Postgres server.

    A small server pool makes clients share server connections all the time, which is
    what breaks a per-connection ``PREPARE``.
    """

    def __init__(self, pool_size: int = 3) -> None:
        self.program = ensure_program("pgbouncer", "pgbouncer")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="agentstate-pgbouncer-"))
        self.pool_size = pool_size
        self.proc: subprocess.Popen[bytes] | None = None
        upstream = urlsplit(PG_SERVER.replace("postgresql+psycopg2", "postgresql"))
        self.upstream = (upstream.hostname or "127.0.0.1", upstream.port or 5432)
        self.user = upstream.username or "postgres"

    @property
    def server(self) -> str:
        """A SQLAlchemy server URL (no database) that goes through PgBouncer."""
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}"

    def version(self) -> str:
        out = subprocess.run(
            [self.program, "--version"], check=False, capture_output=True, text=True
        )
        return out.stdout.splitlines()[0] if out.stdout else "unknown"

    def start(self) -> PgBouncer:
        host, port = self.upstream
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'users.txt'}\n"
            f"admin_users = {self.user}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmax_client_conn = 500\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\npidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        command = [self.program, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            shutil.chown(self.dir, "postgres")
            for item in self.dir.iterdir():
                shutil.chown(item, "postgres")
            command[1:1] = ["-u", "postgres"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_port(self.port)
        return self

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def admin(self, command: str) -> list[tuple[object, ...]]:
        """Run a command on PgBouncer's admin console (``SHOW STATS``, ...)."""
        import psycopg2

        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname="pgbouncer"
        )
        try:
            conn.autocommit = True  # the console has no transactions
            with conn.cursor() as cursor:
                cursor.execute(command)
                return [tuple(row) for row in cursor.fetchall()]
        finally:
            conn.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # immediate shutdown
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelCluster:
    """A Redis primary, one replica and three Sentinels watching them (quorum 2)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="agentstate-sentinel-"))
        self.primary_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def url(self, db: int) -> str:
        """``redis+sentinel://`` URL of the service, database ``db``."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SENTINEL_SERVICE}/{db}"

    def _server(self, port: int, *extra: str) -> None:
        work = self.dir / str(port)
        work.mkdir()
        args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.procs[port] = subprocess.Popen(
            ["redis-server", *args, "--dir", str(work), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(port)

    def start(self) -> SentinelCluster:
        self._server(self.primary_port)
        self._server(self.replica_port, "--replicaof", "127.0.0.1", str(self.primary_port))
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"  # Sentinel rewrites it: a file each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n"
                f"sentinel failover-timeout {SENTINEL_SERVICE} 5000\n"
                f"sentinel parallel-syncs {SENTINEL_SERVICE} 1\n"
            )
            self.procs[port] = subprocess.Popen(
                ["redis-server", str(conf), "--sentinel"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_for_port(port)
        self.wait_for_primary(self.primary_port, replicas=1)
        return self

    def primary(self) -> int | None:
        """The primary's port as the Sentinels' majority reports it."""
        seen: list[int] = []
        for port in self.sentinel_ports:
            try:
                client = redis.Redis(port=port, socket_timeout=1)
                _host, master_port = client.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
                seen.append(int(master_port))
            except (redis.RedisError, TypeError):
                continue
        return max(set(seen), key=seen.count) if len(seen) >= 2 else None

    def wait_for_primary(self, port: int, replicas: int = 0, timeout: float = 30.0) -> None:
        """Until the Sentinels agree that ``port`` is the primary (with ``replicas``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.primary() == port:
                info = redis.Redis(port=port, socket_timeout=1).info("replication")
                if info["role"] == "master" and info["connected_slaves"] >= replicas:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"the Sentinels never agreed on {port} as the primary")

    def kill_primary(self) -> None:
        """SIGKILL the current primary: no goodbye, no last replication."""
        self.procs[self.primary_port].kill()
        self.procs[self.primary_port].wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


class RabbitVhost:
    """The tests' RabbitMQ virtual host (created with rabbitmqctl when missing)."""

    def __init__(self, url: str = AMQP_URL) -> None:
        self.url = url
        self.vhost = urlsplit(url).path.lstrip("/") or "/"
        self.user = urlsplit(url).username or "guest"

    def reachable(self) -> bool:
        from kombu import Connection

        try:
            with Connection(self.url, connect_timeout=3) as conn:
                conn.ensure_connection(max_retries=1)
            return True
        except Exception:
            return False

    def ensure(self) -> RabbitVhost:
        if not self.reachable() and shutil.which("rabbitmqctl"):
            for args in (
                ["add_vhost", self.vhost],
                ["set_permissions", "-p", self.vhost, self.user, ".*", ".*", ".*"],
            ):
                subprocess.run(["rabbitmqctl", *args], check=False, capture_output=True, timeout=60)
            # A vhost just added starts on every node in the background: until it has,
            # a connection to it is refused or reset.
            deadline = time.monotonic() + VHOST_START_TIMEOUT_S
            while not self.reachable() and time.monotonic() < deadline:
                time.sleep(0.2)
        if not self.reachable():
            unavailable(f"RabbitMQ vhost {self.vhost!r} at {urlsplit(self.url).hostname}")
        return self

    def queue_types(self) -> dict[str, str]:
        """Queue name -> type (``quorum``, ``classic``) in this vhost."""
        out = subprocess.run(
            [
                "rabbitmqctl",
                "list_queues",
                "-q",
                "-p",
                self.vhost,
                "name",
                "type",
                "--no-table-headers",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return dict(line.split()[:2] for line in out.stdout.splitlines() if line.strip())

    def delete_queue(self, name: str) -> None:
        """Drop a test's queue (quorum queues outlive their consumers)."""
        from kombu import Connection

        with Connection(self.url) as conn:
            channel = conn.channel()
            channel.queue_delete(name)
            channel.exchange_delete(name)
