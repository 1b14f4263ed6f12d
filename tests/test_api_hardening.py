"""Operating hardening (issue 10 item 10), over a real sidecar process: with auth on, the API
description is behind the token; an oversize gRPC export gets a permanent status code."""

from __future__ import annotations

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from relyscope.testing import start_sidecar

TOKEN = "hardening-token"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
LIMIT = 1 << 20


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = start_sidecar(tmp_path_factory.mktemp("hardening"),
                      extra_env={"RELYSCOPE_AUTH_TOKEN": TOKEN, "RELYSCOPE_MAX_BODY_BYTES": str(LIMIT)})
    yield s
    s.kill()


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_api_description_requires_the_token(sc, path):
    assert httpx.get(sc.api + path, timeout=30).status_code == 401
    assert httpx.get(sc.api + path, headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 401
    r = httpx.get(sc.api + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200
    if path == "/openapi.json":
        assert "/api/v1/report" in r.json()["paths"]


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/healthz"])
def test_probes_stay_open(sc, path):
    assert httpx.get(sc.api + path, timeout=30).status_code == 200


def test_oversize_grpc_export_gets_a_permanent_code(sc):
    req = trace_service_pb2.ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.name = b"\x01" * 16, b"\x02" * 8, "x" * (LIMIT + 1000)  # just over the limit
    with grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as ei:
            export(req.SerializeToString(), timeout=30, metadata=(("authorization", f"Bearer {TOKEN}"),))
    # INVALID_ARGUMENT is not in any stock exporter's retryable set; RESOURCE_EXHAUSTED is
    assert ei.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert str(LIMIT) in ei.value.details()
