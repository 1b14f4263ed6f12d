"""Slow-loris guard for the uvicorn servers: a request's header must arrive within a bound.

uvicorn (0.54, h11) times out idle keep-alive connections but not a request whose header trickles
in: such a connection stays open for ever. :func:`h11_protocol_with_header_timeout` returns
uvicorn's ``H11Protocol`` with one timer more — armed when a connection opens and when the first
byte of each further request arrives, cancelled when the request's header is complete; when it
fires, the connection is closed. (The body has its own bound in the OTLP/HTTP receiver.)
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["h11_protocol_with_header_timeout"]


def h11_protocol_with_header_timeout(timeout_s: float) -> type[H11Protocol]:
    """An ``H11Protocol`` subclass closing a connection whose request header takes longer than
    ``timeout_s`` seconds. Pass it as ``uvicorn.Config(http=...)``."""

    class HeaderTimeoutH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()  # no response: the request never began

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first bytes of a new request on a kept-alive connection
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the header is complete (h11 saw a Request)
                self._disarm()

    return HeaderTimeoutH11
