"""The lingering close (serve/linger.py) on an in-process uvicorn with a tiny ASGI app that
refuses every body unread: the answer and a FIN reach the client, what it still sends is
discarded, and the socket closes at the bounds (bytes, idle time) or when the client closes."""
from __future__ import annotations

import socket
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")
from specdec.frontends.serve import linger  # noqa: E402

from servers import free_port  # noqa: E402


async def refuse(scope, receive, send):
    """413 before the body is read, as --max-body does."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-length", b"2"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": b"no"})


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(linger, "LINGER_BYTES", 1 << 20)
    monkeypatch.setattr(linger, "LINGER_IDLE_S", 0.5)
    port = free_port()
    s = uvicorn.Server(uvicorn.Config(refuse, host="127.0.0.1", port=port, log_level="warning",
                                      http=linger.LingeringH11Protocol, lifespan="off"))
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    while not s.started:
        time.sleep(0.01)
    yield s, port
    s.should_exit = True
    t.join(10)


def _open(port: int, length: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length)
    return sock


def _answer(sock) -> bytes:
    data = b""
    while chunk := sock.recv(4096):                 # the FIN ends it
        data += chunk
    return data


def _closed(s, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while s.server_state.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    return not s.server_state.connections


def test_the_answer_and_a_fin_come_first_and_the_rest_is_discarded(server):
    s, port = server
    with _open(port, 800_000) as sock:
        sock.sendall(b"a" * 300_000)
        assert _answer(sock).startswith(b"HTTP/1.1 413") and not _closed(s, 0.2)   # lingering
        sock.sendall(b"a" * 500_000)                                # the rest: read, dropped
    assert _closed(s, 2.0)                                          # the client closed: so do we


def test_lingering_ends_at_the_byte_bound_and_after_idle_time(server):
    s, port = server
    with _open(port, 8 << 20) as sock:
        assert _answer(sock).startswith(b"HTTP/1.1 413")
        with pytest.raises(OSError):                                # reset past LINGER_BYTES
            for _ in range(64):
                sock.sendall(b"a" * (256 << 10))
                time.sleep(0.01)
    with _open(port, 100) as sock:                                  # a client that stalls
        assert _answer(sock).startswith(b"HTTP/1.1 413")
        assert _closed(s, 2.0)                                      # LINGER_IDLE_S


def test_a_body_read_whole_closes_at_once(server):
    s, port = server
    with _open(port, 0) as sock:
        assert _answer(sock).startswith(b"HTTP/1.1 413")
        assert _closed(s, 0.5)
