"""Bearer-token authentication (``RELYSCOPE_AUTH_TOKEN``) on OTLP/HTTP, OTLP/gRPC and the
management API, over the wire against one sidecar started with a token."""

from __future__ import annotations

import json
import time

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from conftest import start_sidecar

TOKEN = "s3cret-token-for-tests"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED.value[0]  # google.rpc.Code 16


def _request(trace: str) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add().spans.add(
        trace_id=bytes.fromhex(trace), span_id=bytes.fromhex("a1" * 8), name="auth-probe",
        start_time_unix_nano=1760000000000000000, end_time_unix_nano=1760000001000000000)
    return req


def _body(trace: str, ctype: str) -> bytes:
    if ctype == "application/json":  # OTLP/JSON: hex ids
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": trace, "spanId": "a1" * 8, "name": "auth-probe",
            "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000"}]}]}]}).encode()
    return _request(trace).SerializeToString()


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = start_sidecar(tmp_path_factory.mktemp("auth"), extra_env={"RELYSCOPE_AUTH_TOKEN": TOKEN})
    try:
        yield s
    finally:
        s.kill()
        for f in (s.proc.stdout, s.proc.stderr):
            if f:
                f.close()


def _keys(sc, trace: str) -> list:
    r = sc.get("/api/v1/spans", params={"trace_id": trace}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return r.json()["keys"]


@pytest.mark.parametrize("ctype", ["application/json", "application/x-protobuf"])
def test_otlp_http_requires_the_bearer_token(sc, ctype):
    trace = "ab" * 16 if ctype == "application/json" else "cd" * 16
    body = _body(trace, ctype)
    url = f"{sc.otlp_http}/v1/traces"
    for auth in (None, "Bearer wrong-token", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x", "Bearer", f"Bearer  {TOKEN[:-1]}"):
        headers = {"Content-Type": ctype}
        if auth is not None:
            headers["Authorization"] = auth
        r = httpx.post(url, content=body, headers=headers, timeout=30)
        assert r.status_code == 401, auth
        assert r.headers["www-authenticate"].lower().startswith("bearer")
        assert r.headers["content-type"].split(";")[0] == ctype
        st = (json_format.Parse(r.content, status_pb2.Status()) if ctype == "application/json"
              else status_pb2.Status.FromString(r.content))
        assert st.code == UNAUTHENTICATED
    r = httpx.post(url, content=body, headers={"Content-Type": ctype, "Authorization": f"Bearer {TOKEN}"},
                   timeout=30)
    assert r.status_code == 200
    if ctype == "application/json":
        json_format.Parse(r.content, ExportTraceServiceResponse())
    # only the authorized request was stored
    sc.post("/api/v1/flush", headers={"Authorization": f"Bearer {TOKEN}"}).raise_for_status()
    assert _keys(sc, trace) == [[trace, "a1a1a1a1a1a1a1a1"]]


def test_otlp_grpc_requires_the_bearer_token(sc):
    req = _request("ef" * 16)
    with grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        for md in (None, (("authorization", "Bearer nope"),), (("authorization", TOKEN),)):
            with pytest.raises(grpc.RpcError) as ei:
                stub.Export(req, metadata=md, timeout=30)
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        resp = stub.Export(req, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30)
        assert not resp.HasField("partial_success")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_exporters_with_token_headers(sc, protocol):
    headers = {"authorization": f"Bearer {TOKEN}"}
    results = {}
    for name, hdrs in (("with", headers), ("without", None)):
        if protocol == "grpc":
            exp = GrpcExporter(endpoint=f"127.0.0.1:{sc.grpc_port}", insecure=True, headers=hdrs, timeout=10)
        else:
            exp = HttpExporter(endpoint=f"{sc.otlp_http}/v1/traces", headers=hdrs, timeout=10)

        outcomes = []
        orig_export = exp.export

        def export(spans, _orig=orig_export, _out=outcomes):
            res = _orig(spans)
            _out.append(res)
            return res

        exp.export = export
        tp = TracerProvider(resource=Resource.create({"service.name": f"auth-{protocol}-{name}"}))
        tp.add_span_processor(SimpleSpanProcessor(exp))
        with tp.get_tracer("auth").start_as_current_span("invoke_agent x") as s:
            s.set_attribute("gen_ai.operation.name", "invoke_agent")
            ctx = s.get_span_context()
        tp.shutdown()
        results[name] = (outcomes, f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    ok, trace_ok, span_ok = results["with"]
    bad, trace_bad, _ = results["without"]
    assert ok == [SpanExportResult.SUCCESS]
    assert bad == [SpanExportResult.FAILURE]  # UNAUTHENTICATED / 401 are not retried
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _keys(sc, trace_ok):
        time.sleep(0.2)
    assert _keys(sc, trace_ok) == [[trace_ok, span_ok]]
    assert _keys(sc, trace_bad) == []


def test_management_api_requires_token_except_healthz(sc):
    for method, path in (("GET", "/metrics"), ("GET", "/api/v1/report"), ("GET", "/api/v1/trials"),
                         ("GET", "/api/v1/spans"), ("POST", "/api/v1/flush")):
        for auth in (None, "Bearer wrong"):
            h = {"Authorization": auth} if auth else {}
            r = httpx.request(method, sc.api + path, headers=h, timeout=30)
            assert r.status_code == 401, (path, auth)
        r = httpx.request(method, sc.api + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        assert r.status_code == 200, (path, r.text)
    assert "relyscope_spans_received_total" in httpx.get(
        sc.api + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).text
    r = httpx.get(sc.api + "/healthz", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_refused_tokens_are_counted_and_logged(sc):
    """An exporter with a wrong token logged 401s, but the sidecar showed nothing — no counter,
    no log line — while the RelyscopeNoSpans runbook says to check the token (fresh user #7)."""
    def refused() -> float:
        m = sc.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
        line = next(x for x in m.splitlines()
                    if x.startswith('relyscope_otlp_requests_refused_total{reason="unauthenticated"}'))
        return float(line.split()[-1])

    before = refused()
    r = httpx.post(f"{sc.otlp_http}/v1/traces", content=_body("ef" * 16, "application/json"),
                   headers={"Content-Type": "application/json", "Authorization": "Bearer nope"}, timeout=30)
    assert r.status_code == 401
    with grpc.insecure_channel(sc.otlp_grpc.removeprefix("http://")) as ch:
        with pytest.raises(grpc.RpcError) as e:
            trace_service_pb2_grpc.TraceServiceStub(ch).Export(_request("ef" * 16), timeout=30,
                                                                 metadata=[("authorization", "Bearer nope")])
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused() == before + 2
    assert "OTLP requests refused" in sc.log and "bearer token" in sc.log
