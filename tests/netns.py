"""Another "host" inside this machine: a network namespace joined to ours by a veth pair
on a private /30, and relays that let it reach the tests' Redis and Postgres.

Only addresses created here, inside this machine's namespaces, are ever used: the
namespace has no route anywhere but its /30, and the relays listen on the host side's
veth address and forward to the services on 127.0.0.1. Cutting the link (``cut``) is a
network partition: packets are dropped, connections are not closed, and both sides
carry on until the link comes back (``heal``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest


def _ip(*args: str, netns: str | None = None) -> str:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    done = subprocess.run(
        [*prefix, "ip", *args], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 in 10.0.0.0/8 that no address or route of this machine overlaps."""
    taken = []
    for line in (_ip("-4", "-o", "addr") + _ip("-4", "route", "show", "table", "all")).split():
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.ip_network(line, strict=False))
    rng = random.Random()
    for _ in range(200):
        candidate = ipaddress.ip_network(
            f"10.{rng.randrange(100, 250)}.{rng.randrange(256)}.{rng.randrange(64) * 4}/30"
        )
        if not any(candidate.overlaps(net) for net in taken if net.prefixlen > 0):
            return candidate
    raise RuntimeError("no free private /30 found")


class NetNamespace:
    """A network namespace with a veth link to this one, on a /30 of its own."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name = f"agst-{tag}"
        self.host_if, self.peer_if = f"agh{tag}", f"agn{tag}"
        subnet = _free_subnet()
        self.host_addr, self.peer_addr = (str(a) for a in subnet.hosts())
        self.prefix = subnet.prefixlen

    @classmethod
    def create_or_skip(cls) -> NetNamespace:
        """A ready namespace, or a skip saying why this machine cannot make one."""
        if shutil.which("ip") is None:
            pytest.skip("the ip command (iproute2) is missing: no network namespaces")
        if os.geteuid() != 0:
            pytest.skip("network namespaces need root")
        made = cls()
        try:
            made.start()
        except subprocess.CalledProcessError as exc:
            made.close()
            pytest.skip(f"cannot create a network namespace here: {exc.stderr.strip()}")
        return made

    @property
    def launcher(self) -> list[str]:
        """The prefix that runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def start(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.peer_if)
        _ip("link", "set", self.peer_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_addr}/{self.prefix}", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("addr", "add", f"{self.peer_addr}/{self.prefix}", "dev", self.peer_if, netns=self.name)
        _ip("link", "set", self.peer_if, "up", netns=self.name)
        _ip("link", "set", "lo", "up", netns=self.name)

    def cut(self) -> None:
        """Partition: the link goes down, every packet between the two sides is lost."""
        _ip("link", "set", self.host_if, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def can_reach(self, host: str, port: int) -> bool:
        """Whether a TCP connection from inside the namespace gets through in 1 s."""
        probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1)"
        done = subprocess.run(
            [*self.launcher, sys.executable, "-c", probe],
            check=False,
            capture_output=True,
            timeout=30,
        )
        return done.returncode == 0

    def close(self) -> None:
        for args in (["link", "del", self.host_if], ["netns", "del", self.name]):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip(*args)


class Relay:
    """A TCP relay on ``listen_host`` (a free port) to ``upstream`` on this machine."""

    def __init__(self, listen_host: str, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._server = socket.create_server((listen_host, 0))
        self.host, self.port = listen_host, int(self._server.getsockname()[1])
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
                upstream = socket.create_connection(self.upstream)
            except OSError:
                return
            self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def rewrite(self, url: str) -> str:
        """``url`` with its host and port replaced by this relay's."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@" if credentials else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{self.host}:{self.port}"))

    def close(self) -> None:
        self._server.close()
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def endpoint(url: str, default_port: int) -> tuple[str, int]:
    """(host, port) of a service URL."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port
