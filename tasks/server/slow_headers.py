"""A header-read time limit for ``agentstate serve`` (uvicorn has none of its own): a
connection that has not sent a request's whole head within AGENTSTATE_HTTP_HEADER_TIMEOUT
seconds of opening (or of that request's first byte, on a kept-alive connection) is
closed. Without it, a client that opens connections and trickles headers holds them, and
uvicorn's connection cap with them, for ever."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def with_header_timeout(seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, closing connections whose headers are late."""

    class HeaderTimeout(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeout
