"""Listening sockets of the sidecar."""

import socket

from relyscope.sidecar import _bind


def test_listeners_disable_nagle():
    """Bug: without TCP_NODELAY every HTTP response (OTLP/HTTP, API, tool proxy) waited ~40 ms for
    the client's delayed ACK between uvicorn's two writes (measured in bench_shadow_proxy.py)."""
    sock = _bind("127.0.0.1:0")
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
