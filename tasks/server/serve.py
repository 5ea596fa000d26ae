"""``agentstate serve``: the HTTP service under uvicorn, in this process.

Without AGENTSTATE_API_KEYS every caller is the operator, so the service then listens on
loopback only. SIGINT or SIGTERM stops it cleanly: it stops accepting, ends every open
event stream at once (their browsers reconnect to another instance), lets requests in
flight finish for up to GRACE_S seconds, and the command exits 0.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import signal
import socket
from types import FrameType

import uvicorn

from config import Settings
from config.settings import LogFormat
from config.urls import hide_secrets_in
from state.errors import ConfigurationError
from tasks.observability.logs import use_json
from tasks.server.app import create_app, drain
from tasks.server.slow_headers import with_header_timeout

GRACE_S = 5.0
_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def check_host(host: str, settings: Settings) -> None:
    """Refuse a non-loopback address when no key is set (every caller would be the
    operator)."""
    if settings.api_key_users or _loopback(host):
        return
    raise ConfigurationError(
        f"refusing to listen on {host} without AGENTSTATE_API_KEYS: every caller would be "
        "the operator; set keys (key:user_id,key:*) or listen on 127.0.0.1"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, before anything else starts: an address that cannot
    be had (in use, not this machine's, not allowed) is refused in one line, as every
    other start error is, instead of uvicorn's log lines after the banner."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host}: {exc.strerror or exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind(address)
    except OSError as exc:
        sock.close()
        why = (
            "the port is in use (another agentstate serve? pick another --port)"
            if exc.errno == errno.EADDRINUSE
            else exc.strerror or str(exc)
        )
        raise ConfigurationError(f"cannot listen on {host}:{port}: {why}") from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server that also ends the open event streams when asked to stop."""

    def __init__(self, config: uvicorn.Config, app: object) -> None:
        super().__init__(config)
        self.agentstate_app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        drain(self.agentstate_app)  # type: ignore[arg-type]


def serve(host: str, port: int, settings: Settings) -> None:
    """Serve until SIGINT or SIGTERM; return once stopped."""
    check_host(host, settings)
    sock = listening_socket(host, port)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        timeout_graceful_shutdown=int(GRACE_S),
        http=with_header_timeout(settings.http_header_timeout),
        limit_concurrency=settings.http_max_connections,
        server_header=False,
        log_level="info",
    )
    for name in _LOGGERS:  # uvicorn configured its handlers just now
        if settings.log_format == LogFormat.JSON:
            use_json(logging.getLogger(name))
        hide_secrets_in(logging.getLogger(name))
    server = _Server(config, app)
    keys = settings.api_key_users
    mode = (
        f"{len(keys)} API keys" if keys else "no API keys: loopback only, callers are the operator"
    )
    logging.getLogger(__name__).warning(
        "agentstate serve on http://%s:%d (console at /, API under /v1; %s)", host, port, mode
    )

    def stop(sig: int, frame: FrameType | None) -> None:
        # Before uvicorn listens (and after it stopped: it re-raises the signals it
        # caught into these handlers) a stop is a stop, not an error.
        server.should_exit = True

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, stop) for sig in handled}
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
