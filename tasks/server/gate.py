"""Who may reach the app at all, decided from the request's head before a byte of its body
is read. Plain ASGI middleware inside ``create_app()``, so it holds under any ASGI server,
not only ``agentstate serve``:

- Without keys (AGENTSTATE_API_KEYS unset) every caller is the operator, which is only
  safe for programs on this machine. A web page can still reach a loopback server: by DNS
  rebinding (its own name pointed at 127.0.0.1: the browser sends that name as ``Host``),
  answered 421, and by a plain cross-site form or fetch (``/cancel`` and ``/retry`` take no
  body), answered 403 for any state-changing method when ``Origin`` names another site or
  ``Sec-Fetch-Site`` says ``cross-site``.
- With keys, a request to a keyed route without a valid key answers 401 before its body
  is read, and an address that presented AGENTSTATE_HTTP_BAD_KEY_LIMIT wrong keys within
  a minute answers 429 (``Retry-After``) until that minute is over.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from state.errors import UnauthorizedError
from tasks.server.auth import KeyTable
from tasks.server.errors import error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The routes that need a key (the console's files, health and the OpenAPI document do not).
KEYED_PREFIXES = ("/v1/", "/lg/", "/agui/", "/a2a/", "/mcp")
# A2A agent cards are public (the protocol asks that a caller can read one without a key).
PUBLIC_SUFFIXES = ("/.well-known/agent-card.json",)
# LangGraph's clients read errors as {"detail": ...}.
DETAIL_PREFIXES = ("/lg/",)
WINDOW_S = 60.0
_ADDRESSES_KEPT = 10_000  # addresses remembered at once (the oldest is forgotten first)


def host_name(value: str) -> str:
    """The name of a ``Host`` header (or an origin's netloc), lower case, without its port:
    ``[::1]:8000`` -> ``[::1]``, ``localhost:80`` -> ``localhost``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def loopback(value: str) -> bool:
    """Whether a ``Host`` header names this machine by a loopback name."""
    return host_name(value) in LOOPBACK_NAMES


def cross_site(origin: str | None, fetch_site: str | None) -> bool:
    """Whether a browser says the request comes from a page of another site."""
    if fetch_site is not None and fetch_site.strip().lower() == "cross-site":
        return True
    if origin is None:
        return False
    parts = urlsplit(origin.strip())
    return not (parts.scheme in ("http", "https") and loopback(parts.netloc))


class BadKeys:
    """Wrong keys per client address over the last minute (this process's count)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, address: str, now: float) -> int | None:
        """Seconds until ``address`` may try again (None: it may now)."""
        times = self._recent(address, now)
        if times is None or len(times) < self.limit:
            return None
        return max(1, math.ceil(times[0] + WINDOW_S - now))

    def failed(self, address: str, now: float) -> None:
        times = self._recent(address, now)
        if times is None:
            times = self.seen[address] = deque(maxlen=self.limit)
            if len(self.seen) > _ADDRESSES_KEPT:
                self.seen.popitem(last=False)
        times.append(now)

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self.seen.get(address)
        if times is None:
            return None
        while times and times[0] <= now - WINDOW_S:
            times.popleft()
        return times


class Gate:
    """The checks above, in front of everything else."""

    def __init__(self, app: ASGIApp, keys: KeyTable, bad_key_limit: int) -> None:
        self.app = app
        self.keys = keys
        self.bad_keys = BadKeys(bad_key_limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value for name, value in scope["headers"]}
        refusal = (
            self._keyed(scope, headers) if self.keys.enabled else self._keyless(scope, headers)
        )
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _keyless(self, scope: Scope, headers: dict[str, bytes]) -> ASGIApp | None:
        host = headers.get("host", b"").decode("latin-1")
        if not loopback(host):
            return error_response(
                421,
                "misdirected",
                "without AGENTSTATE_API_KEYS this service answers only to a loopback Host "
                "(localhost, 127.0.0.1, [::1]); set keys to serve other names",
            )
        origin = headers.get("origin")
        fetch_site = headers.get("sec-fetch-site")
        if scope["method"] not in SAFE_METHODS and cross_site(
            None if origin is None else origin.decode("latin-1"),
            None if fetch_site is None else fetch_site.decode("latin-1"),
        ):
            return error_response(
                403,
                "forbidden",
                "a web page of another site may not change anything here (no-key mode); "
                "set AGENTSTATE_API_KEYS to serve other sites",
            )
        return None

    def _keyed(self, scope: Scope, headers: dict[str, bytes]) -> ASGIApp | None:
        path = str(scope["path"])
        if not path.startswith(KEYED_PREFIXES) or path.endswith(PUBLIC_SUFFIXES):
            return None
        address = (scope.get("client") or ("", 0))[0] or ""
        now = time.monotonic()
        wait = self.bad_keys.retry_after(address, now)
        if wait is not None:
            response = error_response(
                429,
                "rate_limited",
                "too many wrong keys from this address (AGENTSTATE_HTTP_BAD_KEY_LIMIT a "
                "minute); try again later",
            )
            response.headers["Retry-After"] = str(wait)
            return response
        presented = presented_key(headers)
        try:
            self.keys.caller(presented)
        except UnauthorizedError as exc:
            if presented is not None:  # a wrong key is a guess; no key at all is not
                self.bad_keys.failed(address, now)
            if path.startswith(DETAIL_PREFIXES):
                return JSONResponse(
                    {"detail": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
            return error_response(401, "unauthorized", str(exc))
        return None


def presented_key(headers: dict[str, bytes]) -> str | None:
    """The key a request presents: ``Authorization: Bearer KEY`` (or ``x-api-key``, as
    LangGraph's clients send it)."""
    authorization = headers.get("authorization")
    if authorization is not None:
        scheme, _, credentials = authorization.decode("latin-1").partition(" ")
        return credentials.strip() if scheme.lower() == "bearer" and credentials else None
    api_key = headers.get("x-api-key")
    return None if api_key is None else api_key.decode("latin-1").strip() or None
