"""``agentstate serve``: the HTTP API and the console (``tasks.server``), which need the
``server`` extra (``pip install 'agentstate[server]'``)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from config import get_settings
from state.errors import MissingDependencyError, UsageError
from tasks.cli.support import command

DESCRIPTION = """\
Serve the HTTP API (JSON under /v1, its OpenAPI document at /openapi.json, /healthz and
/readyz) and the console (at /) until SIGINT or SIGTERM.

Callers send `Authorization: Bearer KEY` with a key of AGENTSTATE_API_KEYS
("key:user_id,key2:*"; key:* is an operator key); a user's key reaches only that user's
sessions, workflows and approvals. Without AGENTSTATE_API_KEYS every caller is the
operator, so the service listens on loopback addresses only.
"""


def add_serve(sub: Any) -> None:
    serve = command(sub, "serve", cmd_serve, "serve the HTTP API and the console")
    serve.description = DESCRIPTION
    serve.formatter_class = argparse.RawDescriptionHelpFormatter
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (127.0.0.1; needs keys for any address that is not loopback)",
    )
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (8000)")


def cmd_serve(args: argparse.Namespace) -> None:
    """Serve until stopped."""
    if not 0 < args.port < 65536:
        raise UsageError("--port must be between 1 and 65535")
    for module in ("fastapi", "uvicorn"):
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingDependencyError(
                f"agentstate serve needs the server extra ({module} is missing): "
                "pip install 'agentstate[server]'"
            ) from None
    from tasks.server.serve import serve

    serve(args.host, args.port, get_settings())
