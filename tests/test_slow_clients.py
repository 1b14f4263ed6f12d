"""Slow-loris guard (issue 10 item 10), over a real sidecar process: a request whose header
trickles in is cut off after ``RELYSCOPE_HTTP_READ_TIMEOUT_S``; a body that does not arrive in time
gets 408 and gives its in-flight budget back; normal keep-alive requests are unaffected."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from relyscope.testing import start_sidecar
from test_durability import make_trace, metric, post_json, trace_id_of, wait_until

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = start_sidecar(tmp_path_factory.mktemp("slow"), extra_env={"RELYSCOPE_HTTP_READ_TIMEOUT_S": str(TIMEOUT_S)})
    yield s
    s.kill()


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True, got
            got += chunk
    except socket.timeout:
        return False, got


@pytest.mark.parametrize("port_of", ["http_port", "api_port"])
def test_trickling_header_is_cut_off(sc, port_of):
    s = socket.create_connection(("127.0.0.1", getattr(sc, port_of)), timeout=10)
    try:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # ... and the rest never comes
        t0 = time.monotonic()
        closed, _ = _closed_within(s, TIMEOUT_S + 5)
        assert closed and time.monotonic() - t0 < TIMEOUT_S + 5
    finally:
        s.close()


def test_slow_body_gets_408_and_releases_the_budget(sc):
    s = socket.create_connection(("127.0.0.1", sc.http_port), timeout=10)
    try:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{\"resourceSpans\"")
        closed, reply = _closed_within(s, TIMEOUT_S + 5)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    finally:
        s.close()
    wait_until(lambda: metric(sc, "relyscope_inflight_bytes") == 0, what="budget released")


def test_keep_alive_requests_are_unaffected(sc):
    with httpx.Client() as client:
        for i in range(3):
            assert post_json(sc, make_trace(trace_id_of(90, i), task="t0"), client=client).status_code == 200
            time.sleep(TIMEOUT_S * 1.5)  # idle between requests longer than the header timeout
