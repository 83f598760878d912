"""A lingering close, as nginx's: every refusal reaches a client that sends its body whole.

A 413 is answered before the body is read, a 408 while it stalls; the connection is then
closed (`Connection: close`).  Closing a socket whose client is still sending makes the
kernel answer the unread or later bytes with a reset, and a client that sends the whole body
before it reads (Python's urllib, `requests`) sees "Connection reset by peer" or "Broken
pipe" instead of the answer.  So a connection closed while its request body is unfinished is
half-closed instead: the answer is flushed and a FIN sent, what the client still sends is read
and discarded, and the socket closes when the client closes its side, or after LINGER_BYTES
bytes, LINGER_S seconds in all or LINGER_IDLE_S seconds without data (nginx's lingering_time
and lingering_timeout), whichever comes first.

`LingeringH11Protocol` is uvicorn's h11 protocol with that close (uvicorn.Config(http=...))."""
from __future__ import annotations

import asyncio
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LINGER_BYTES = 64 << 20
LINGER_S = 30.0
LINGER_IDLE_S = 5.0


class _Lingering:
    """The connection's transport as the protocol sees it: close() while the client is still
    sending its body starts the lingering close; any other close() closes."""

    def __init__(self, transport: asyncio.Transport, protocol: "LingeringH11Protocol"):
        self._t, self._p = transport, protocol
        self.lingering = False
        self._left = LINGER_BYTES
        self._until = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def __getattr__(self, name):                # everything else: the transport's own
        return getattr(self._t, name)

    def is_closing(self) -> bool:
        return self.lingering or self._t.is_closing()

    def close(self) -> None:
        if (self.lingering or self._t.is_closing() or not self._t.can_write_eof()
                or self._p.conn.their_state is not h11.SEND_BODY):
            self._close()
            return
        self.lingering = True
        self._until = time.monotonic() + LINGER_S
        self._t.write_eof()                     # after the buffered answer: a FIN
        self._t.resume_reading()
        self._arm()

    def discard(self, n: int) -> None:
        """n more bytes of the client's read and dropped."""
        self._left -= n
        if self._left < 0:
            self._close()
        else:
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        wait = min(LINGER_IDLE_S, self._until - time.monotonic())
        self._timer = asyncio.get_running_loop().call_later(max(wait, 0.0), self._close)

    def _close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._t.close()


class LingeringH11Protocol(H11Protocol):
    """uvicorn's h11 protocol whose connections close lingering (the module's docstring)."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(_Lingering(transport, self))

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:
            self.transport.discard(len(data))
        else:
            super().data_received(data)

    def eof_received(self):
        if self.transport.lingering:            # the client is done: close both sides
            self.transport.close()
        return super().eof_received()
