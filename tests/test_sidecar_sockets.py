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


def test_port_in_use_is_a_clear_error_not_a_crash(tmp_path):
    """Bug: `relyscope serve` on a busy port printed the bind error, then died of SIGSEGV (exit
    139) while the embedded store it had opened was torn down at exit."""
    import os
    import subprocess

    from relyscope.testing import RELYSCOPE_BIN

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    env = {**os.environ, "RELYSCOPE_STORE": f"chdb://{tmp_path}/data", "RELYSCOPE_SPOOL_DIR": str(tmp_path / "spool"),
           "RELYSCOPE_OTLP_GRPC": "127.0.0.1:0", "RELYSCOPE_OTLP_HTTP": "127.0.0.1:0"}
    try:
        p = subprocess.run([str(RELYSCOPE_BIN), "serve", "--api", f"127.0.0.1:{port}"], env=env,
                           capture_output=True, text=True, timeout=120)
    finally:
        busy.close()
    assert p.returncode in (1, 2), (p.returncode, p.stderr[-2000:])
    assert "cannot bind" in p.stderr and "Address already in use" in p.stderr
