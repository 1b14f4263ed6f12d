"""Interop over real OTLP: the OTel Python SDK → rotel (a real OTLP collector, PyPI ``rotel``, its
``rotel-agent`` binary run in the foreground) → the sidecar, over both rotel exporters (OTLP/gRPC,
OTLP/HTTP) with gzip; and the SDK's own gRPC / HTTP exporters with gzip straight to the sidecar.

Every span created is expected in the store exactly once (the exact (trace_id, span_id) set, the
distinct count equal to the number created) and every agent run assembled into a trial.
For the HTTP relay a small recording proxy sits between rotel and the sidecar, to show the bodies
really were gzip-compressed on the wire.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from grpc import Compression as GrpcCompression

from relyscope.testing import free_ports

rotel = pytest.importorskip("rotel")
ROTEL_AGENT = Path(rotel.__file__).parent / "rotel-agent"

N_RUNS = 8  # agent runs per test; 3 spans each (agent root, model call, tool call)


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rotel-agent exited {proc.returncode}: {proc.stdout.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"rotel-agent did not listen on {port}")


class Rotel:
    """``rotel-agent start`` in the foreground (its own PID; stopped with SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path, endpoint: str, protocol: str):
        self.grpc_port, self.http_port = free_ports(2)
        args = [str(ROTEL_AGENT), "start",
                "--otlp-grpc-endpoint", f"127.0.0.1:{self.grpc_port}",
                "--otlp-http-endpoint", f"127.0.0.1:{self.http_port}",
                "--exporter", "otlp", "--otlp-exporter-endpoint", endpoint,
                "--otlp-exporter-protocol", protocol, "--otlp-exporter-compression", "gzip",
                "--batch-timeout", "100ms",
                "--pid-file", str(workdir / "rotel.pid"), "--log-file", str(workdir / "rotel.log")]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            _wait_port(self.grpc_port, self.proc)
            _wait_port(self.http_port, self.proc)
        except Exception:
            self.stop()
            raise

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        out = self.proc.stdout.read() if self.proc.stdout else ""
        if self.proc.stdout:
            self.proc.stdout.close()
        return out


class RecordingProxy:
    """A loopback HTTP proxy for ``POST /v1/traces``: records the request headers, forwards the
    body unchanged to ``target`` and returns the target's reply."""

    def __init__(self, target: str):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.append({"path": self.path, "content-encoding": self.headers.get("Content-Encoding"),
                             "content-type": self.headers.get("Content-Type"), "bytes": len(body)})
                fwd = {k: v for k, v in self.headers.items()
                       if k.lower() in ("content-type", "content-encoding", "authorization")}
                r = httpx.post(target + self.path, content=body, headers=fwd, timeout=30)
                self.send_response(r.status_code)
                for k in ("content-type", "retry-after"):
                    if k in r.headers:
                        self.send_header(k, r.headers[k])
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def log_message(self, *a):  # quiet
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _emit(exporter, service: str, n_runs: int = N_RUNS) -> set[tuple[str, str]]:
    """Run ``n_runs`` instrumented agent runs through ``exporter``; return the (trace, span) ids."""
    tp = TracerProvider(resource=Resource.create({"service.name": service, "service.version": "1.0"}))
    tp.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50, max_export_batch_size=7))
    tracer = tp.get_tracer("interop-test")
    ids: set[tuple[str, str]] = set()

    def keep(span) -> None:
        ctx = span.get_span_context()
        ids.add((f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"))

    for run in range(n_runs):
        with tracer.start_as_current_span(f"invoke_agent {service}") as root:
            root.set_attribute("gen_ai.operation.name", "invoke_agent")
            root.set_attribute("gen_ai.agent.name", service)
            root.set_attribute("relyscope.task.id", f"task-{run % 3}")
            keep(root)
            with tracer.start_as_current_span("chat m") as llm:
                llm.set_attribute("gen_ai.operation.name", "chat")
                llm.set_attribute("gen_ai.usage.input_tokens", 10 + run)
                llm.set_attribute("gen_ai.usage.output_tokens", 5)
                keep(llm)
            with tracer.start_as_current_span("execute_tool lookup") as tool:
                tool.set_attribute("gen_ai.operation.name", "execute_tool")
                tool.set_attribute("gen_ai.tool.name", "lookup")
                keep(tool)
    assert tp.force_flush(30_000)
    tp.shutdown()
    assert len(ids) == 3 * n_runs
    return ids


def _wait_for_keys(sc, expected: set[tuple[str, str]], timeout_s: float = 45) -> list[tuple[str, str]]:
    deadline = time.monotonic() + timeout_s
    keys: list[tuple[str, str]] = []
    while time.monotonic() < deadline:
        keys = [tuple(k) for k in sc.get("/api/v1/spans", params={"keys": "true"}).json()["keys"]]
        if expected <= set(keys):
            break
        time.sleep(0.3)
    return keys


def _check_exactly_once(sc, expected: set[tuple[str, str]], service: str) -> None:
    keys = _wait_for_keys(sc, expected)
    missing = expected - set(keys)
    assert not missing, f"{len(missing)} of {len(expected)} spans never arrived"
    assert len(keys) == len(set(keys)), "a (trace_id, span_id) is listed twice"
    assert set(keys) == expected  # nothing else arrived either
    assert sc.get("/api/v1/spans").json()["spans"] == len(expected)
    sc.flush()
    trials = sc.trials(agent=service)
    assert len(trials) == N_RUNS
    assert {t["trace_id"] for t in trials} == {t for t, _ in expected}
    assert all(t["actions"] == ["llm", "lookup"] and t["span_count"] == 3 for t in trials)
    # token sums per run are 10+run / 5: the multiset of input tokens shows no run lost or doubled
    assert sorted(t["input_tokens"] for t in trials) == [10 + r for r in range(N_RUNS)]


@pytest.mark.parametrize("relay", ["grpc", "http"])
def test_sdk_to_rotel_to_sidecar_every_span_once(sidecar, tmp_path, relay):
    """SDK --(OTLP/HTTP gzip | OTLP/gRPC gzip)--> rotel --(``relay`` gzip)--> sidecar."""
    service = f"rotel-{relay}-agent"
    proxy = RecordingProxy(sidecar.otlp_http) if relay == "http" else None
    endpoint = proxy.url if proxy else sidecar.otlp_grpc
    agent = Rotel(tmp_path, endpoint, relay)
    out = ""
    try:
        # the SDK talks to rotel over the other protocol, so both rotel receivers are exercised
        if relay == "grpc":
            exporter = HttpExporter(endpoint=f"http://127.0.0.1:{agent.http_port}/v1/traces",
                                    compression=HttpCompression.Gzip)
        else:
            exporter = GrpcExporter(endpoint=f"127.0.0.1:{agent.grpc_port}", insecure=True,
                                    compression=GrpcCompression.Gzip)
        expected = _emit(exporter, service)
        _check_exactly_once(sidecar, expected, service)
    finally:
        out = agent.stop()
        if proxy:
            proxy.stop()
    assert "panicked" not in out, out[-2000:]
    if proxy:
        assert proxy.seen, "rotel never reached the sidecar through the proxy"
        assert {r["path"] for r in proxy.seen} == {"/v1/traces"}
        assert {r["content-encoding"] for r in proxy.seen} == {"gzip"}
        assert {r["content-type"].split(";")[0] for r in proxy.seen} == {"application/x-protobuf"}


def test_sdk_exporters_with_gzip_directly_every_span_once(sidecar):
    service_g, service_h = "sdk-grpc-gzip", "sdk-http-gzip"
    eg = _emit(GrpcExporter(endpoint=f"127.0.0.1:{sidecar.grpc_port}", insecure=True,
                            compression=GrpcCompression.Gzip), service_g)
    eh = _emit(HttpExporter(endpoint=f"{sidecar.otlp_http}/v1/traces", compression=HttpCompression.Gzip),
               service_h)
    keys = _wait_for_keys(sidecar, eg | eh)
    assert set(keys) == eg | eh and len(keys) == len(eg) + len(eh)
    sidecar.flush()
    for service, exp in ((service_g, eg), (service_h, eh)):
        trials = sidecar.trials(agent=service)
        assert len(trials) == N_RUNS
        assert {t["trace_id"] for t in trials} == {t for t, _ in exp}
