"""Health: the process answers (``/healthz``), and so do its database and Redis
(``/readyz``, 503 otherwise); Prometheus metrics (``/metrics``). None needs a key: load
balancers and scrapers call them (metrics are counts, never ids or content)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import anyio
from anyio import to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text

from state.storage.backend import Backend
from state.storage.db import read_connection
from tasks.observability.metrics import render
from tasks.server.models import Health

router = APIRouter(tags=["health"])

CHECK_TIMEOUT_S = 3.0


@router.get("/healthz", summary="The process is up")
async def healthz() -> Health:
    return Health(status="ok")


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


@router.get(
    "/readyz",
    summary="The database and Redis answer",
    responses={503: {"model": Health, "description": "a check failed"}},
)
async def readyz(backend: Annotated[Backend, Depends(_backend)]) -> JSONResponse:
    checks = {
        "database": await _check(lambda: _database(backend)),
        "redis": await _check(lambda: bool(backend.redis.ping())),
    }
    ready = all(value == "ok" for value in checks.values())
    body = Health(status="ok" if ready else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


def _database(backend: Backend) -> bool:
    with read_connection(backend.engine) as conn:
        conn.execute(text("SELECT 1"))
    return True


async def _check(probe: Callable[[], bool]) -> str:
    try:
        with anyio.fail_after(CHECK_TIMEOUT_S):
            await to_thread.run_sync(probe, abandon_on_cancel=True)
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:g} s"
    except Exception as exc:
        return type(exc).__name__
    return "ok"


@router.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    # The gauges read the database (at most every few seconds): off the event loop.
    body, content_type = await to_thread.run_sync(render, request.app.state.metrics)
    return Response(body, media_type=content_type)
