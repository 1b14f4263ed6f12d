"""The client commands find the sidecar through ``RELYSCOPE_API``, the variable ``relyscope serve``
binds: a user who started ``serve`` with ``RELYSCOPE_API=127.0.0.1:19464`` and ran ``relyscope
report`` with the same variable got "no sidecar answers at http://127.0.0.1:9464" — every client
command read only ``--api`` (a URL) and the README says every flag is also an environment
variable. The value may be a URL or the HOST:PORT that ``serve`` binds."""

from __future__ import annotations

import http.server
import os
import subprocess

import pytest
import typer

from relyscope.cli._api import api_url
from relyscope.testing import RELYSCOPE_BIN, http_stub


@pytest.mark.parametrize("value, url", [
    ("127.0.0.1:19464", "http://127.0.0.1:19464"),
    ("0.0.0.0:9464", "http://127.0.0.1:9464"),     # bind-all: the client dials loopback
    (":9464", "http://127.0.0.1:9464"),
    ("[::]:9464", "http://[::1]:9464"),
    ("[::1]:9464", "http://[::1]:9464"),
    ("sidecar.local:9464", "http://sidecar.local:9464"),
    ("https://sidecar.example:8443/", "https://sidecar.example:8443/"),  # a URL is kept as given
    (None, None),
])
def test_api_url(value, url):
    assert api_url(value) == url


@pytest.mark.parametrize("value", ["ftp://x:1", "http://", "9464", "host:port", "host:9464/api", "http://[::1",
                                   "http://h:99999", "http://:80"])
def test_api_url_refuses_what_is_neither(value):
    with pytest.raises(typer.BadParameter):
        api_url(value)


class _Stub(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []

    def _answer(self) -> None:
        _Stub.paths.append(self.path.split("?")[0])
        self.send_response(503)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"detail": "stub"}')

    do_GET = do_POST = _answer

    def log_message(self, *a) -> None:
        pass


@pytest.mark.parametrize("args, path", [
    (["report"], "/api/v1/report"),
    (["history", "R"], "/api/v1/history"),
    (["shadow", "list"], "/api/v1/shadow"),
    (["gate", "--baseline", "1", "--candidate", "2"], "/api/v1/gate"),
])
def test_client_commands_read_relyscope_api(tmp_path, args, path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    with http_stub(_Stub) as port:
        _Stub.paths = []
        env.update(RELYSCOPE_API=f"0.0.0.0:{port}", RELYSCOPE_STORE=f"chdb://{tmp_path}/none", COLUMNS="200")
        r = subprocess.run([str(RELYSCOPE_BIN), *args], capture_output=True, text=True, timeout=120, env=env,
                           cwd=tmp_path)
    assert _Stub.paths and _Stub.paths[0].startswith(path), (_Stub.paths, r.stderr)
    assert "9464" not in r.stderr + r.stdout  # the default address is never tried
