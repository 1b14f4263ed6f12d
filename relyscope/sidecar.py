"""Run the sidecar: store, pipeline, OTLP/gRPC + OTLP/HTTP receivers and the management API.

``Sidecar(settings).start()`` binds every port (port 0 picks a free one; the bound addresses are
in ``.otlp_grpc_port``, ``.otlp_http_port``, ``.api_port``), and returns; ``stop()`` shuts down in
reverse order and is idempotent. ``relyscope serve`` runs one until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import uvicorn

from relyscope import memory
from relyscope.collector.http_timeouts import h11_protocol_with_header_timeout
from relyscope.collector.receivers import create_grpc_server, create_otlp_http_app
from relyscope.config import Settings, parse_hostport
from relyscope.exporter.api import create_api_app
from relyscope.pipeline import Pipeline
from relyscope.store import Store

__all__ = ["Sidecar"]

log = logging.getLogger("relyscope.sidecar")


def _bind(addr: str) -> socket.socket:
    host, port = parse_hostport(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit TCP_NODELAY (Linux): uvicorn writes a response's head and body
    # separately, and Nagle + the client's delayed ACK held every second write ~40 ms (each OTLP/HTTP
    # export and tool-proxy call took 44 ms on loopback; 0.2 ms with this; bench/README.md)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise RuntimeError(f"cannot bind {addr}: {e}") from e
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class _UvicornThread:
    def __init__(self, app, sock: socket.socket, name: str, settings: Settings):
        ssl = {}
        if settings.tls_cert_file and settings.tls_key_file:
            ssl = {"ssl_certfile": settings.tls_cert_file, "ssl_keyfile": settings.tls_key_file}
        cfg = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                             timeout_graceful_shutdown=2,
                             http=h11_protocol_with_header_timeout(settings.http_read_timeout_s), **ssl)
        self.server = uvicorn.Server(cfg)
        self.server.install_signal_handlers = lambda: None  # uvicorn < 0.29 API; harmless otherwise
        self.sock = sock
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self):
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self):
        self.thread.start()

    def stop(self, wait: bool = True):
        self.server.should_exit = True
        if wait:
            self.thread.join(10)


class Sidecar:
    """The whole sidecar in one process. See the module docstring."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.store: Store | None = None
        self.pipeline: Pipeline | None = None
        self._grpc = None
        self._http: list[_UvicornThread] = []
        self._stopped = False
        self._trimmer: memory.Trimmer | None = None

    def start(self) -> "Sidecar":
        """Open the store, start the pipeline and every server. On any failure (a port in use, a
        bad TLS file) everything already started is stopped and the store closed before the error
        propagates (an embedded store left open crashed the process at exit)."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "Sidecar":
        s = self.settings
        token = s.auth_token.get_secret_value() if s.auth_token else None
        if s.malloc_arena_max:  # before the store's and the pipeline's threads allocate
            memory.set_arena_max(s.malloc_arena_max)
        from relyscope.store.schema import Retention

        self.store = Store(s.store, fault_file=s.fault_store_down_file, lazy=True,
                           retention=Retention.from_settings(s))
        # glibc's heap and chDB's own jemalloc
        self._trimmer = memory.Trimmer(s.malloc_trim_interval_s, purge=self.store.release_memory).start()
        self.pipeline = Pipeline(s, self.store)
        self.pipeline.start()
        http_sock = _bind(s.otlp_http)
        api_sock = _bind(s.api)
        self.otlp_http_port = http_sock.getsockname()[1]
        self.api_port = api_sock.getsockname()[1]
        tls = None
        if s.tls_cert_file and s.tls_key_file:
            tls = (open(s.tls_cert_file, "rb").read(), open(s.tls_key_file, "rb").read())
        self._grpc, self.otlp_grpc_port = create_grpc_server(self.pipeline, s.otlp_grpc, token=token, tls=tls)
        from relyscope.shadow.stage import ShadowStage

        api_host = api_sock.getsockname()[0]
        api_host = "127.0.0.1" if api_host in ("0.0.0.0", "::") else api_host
        self.shadow = ShadowStage(s, self.store, self.pipeline.policy,
                                  proxy_base_url=f"http://{api_host}:{self.api_port}",
                                  state_path=f"{self.pipeline.spool_dir.rstrip('/')}.shadow.json")
        self.pipeline.shadow = self.shadow
        self._http = [
            _UvicornThread(create_otlp_http_app(self.pipeline, token=token), http_sock, "otlp-http", s),
            _UvicornThread(create_api_app(self.pipeline, token=token), api_sock, "api", s),
        ]
        for h in self._http:
            h.start()
        self.shadow.start()
        return self

    def stop(self) -> None:
        """Graceful stop within ``settings.stop_timeout_s`` (plus ~2 s to close): the receivers
        keep answering — and spooling — while the queue drains (readiness says ``stopping``);
        then they close (in-flight requests finish), the worker stores what arrived meanwhile
        with the time left, and the store closes. What is not stored stays in the spool for the
        next start. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        deadline = time.monotonic() + self.settings.stop_timeout_s
        if self.pipeline is not None:
            self.pipeline.drain(self.settings.stop_timeout_s, quiet_s=self.settings.stop_quiet_s)
        if getattr(self, "shadow", None) is not None:
            self.shadow.shutdown()
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait(2)
        for h in self._http:  # both at once: each takes up to its graceful-shutdown timeout
            h.stop(wait=False)
        for h in self._http:
            h.stop()
        if self.pipeline is not None:
            self.pipeline.shutdown(timeout_s=max(0.5, deadline - time.monotonic()))
        if self._trimmer is not None:  # before the store closes: it purges through the store
            self._trimmer.stop()
        if self.store is not None:
            self.store.close()
