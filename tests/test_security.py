"""Issue 3 (security): redaction before storage, attribute limits, and TLS on both OTLP endpoints."""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import ssl
import subprocess
import time

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from conftest import start_sidecar

from relyscope.collector.redaction import MASK, Redactor
from relyscope.model import CanonicalSpan


def _span(attrs: dict) -> CanonicalSpan:
    return CanonicalSpan(trace_id="1" * 32, span_id="2" * 16, parent_span_id="", name="chat m", kind=3,
                         start_ns=1, end_ns=2, attributes=attrs)


def test_redactor_deny_allow_and_masks():
    card = "4111 1111 1111 1111"
    r = Redactor(deny=["user.email", "llm.input_messages.*"], patterns=[r"\b(?:\d[ -]?){13,16}\b"], key=b"k" * 32)
    out = r.apply(_span({"gen_ai.input.messages": f"my card is {card}", "user.email": "a@b.c",
                         "llm.input_messages.0.message.content": "x", "gen_ai.request.model": f"m {card}"}))
    assert out.attributes["gen_ai.input.messages"] == f"my card is {MASK}"
    assert "user.email" not in out.attributes and "llm.input_messages.0.message.content" not in out.attributes
    # masks apply to every string, not only to content attributes (issue 10 item 7); an exact value
    # scoring reads (the model name) gets the keyed token of the match, so two models stay two
    # (HMAC-SHA256 worked out with the standard library, first 16 hex digits)
    token = hmac.new(b"k" * 32, card.encode(), hashlib.sha256).hexdigest()[:16]
    assert out.attributes["gen_ai.request.model"] == f"m [REDACTED:{token}]"
    assert "redacted" in out.flags
    # nested structured content is masked too
    out = r.apply(_span({"gen_ai.output.messages": [{"parts": [{"content": f"card {card}"}]}]}))
    assert out.attributes["gen_ai.output.messages"] == [{"parts": [{"content": f"card {MASK}"}]}]
    # allow list: only listed keys survive
    out = Redactor(allow=["gen_ai.*"]).apply(_span({"gen_ai.request.model": "m", "http.url": "u"}))
    assert set(out.attributes) == {"gen_ai.request.model"}
    # inactive redactor returns the very same object (no cost on the hot path)
    s = _span({"a": 1})
    assert Redactor().apply(s) is s
    with pytest.raises(Exception):
        Redactor(patterns=["("])


def test_redaction_applies_before_storage(tmp_path):
    sc = start_sidecar(tmp_path, extra_env={
        "RELYSCOPE_REDACT_DENY": json.dumps(["user.email"]),
        "RELYSCOPE_REDACT_PATTERNS": json.dumps([r"sk-[A-Za-z0-9]{8,}"]),
    })
    try:
        body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": "ab" * 16, "spanId": "cd" * 8, "name": "chat m", "kind": 3,
            "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                {"key": "gen_ai.input.messages", "value": {"stringValue": "use key sk-ABCDEFGH1234 please"}},
                {"key": "user.email", "value": {"stringValue": "someone@example.com"}}]}]}]}]}
        assert httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
        sc.flush()
    finally:
        sc.kill()
    from relyscope.store import Store

    st = Store(f"chdb://{tmp_path}/data")
    try:
        rows = st.query("SELECT SpanAttributes, RelyscopeFlags FROM {db}.otel_traces FINAL")
    finally:
        st.close()
    attrs, flags = rows[0]
    assert attrs["gen_ai.input.messages"] == f"use key {MASK} please"
    assert "user.email" not in attrs
    assert "redacted" in flags


def test_attribute_count_and_length_limits(tmp_path):
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_MAX_ATTRIBUTES": "3", "RELYSCOPE_MAX_ATTRIBUTE_LENGTH": "5"})
    try:
        attrs = [{"key": f"k{i}", "value": {"stringValue": "abcdefgh"}} for i in range(6)]
        body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": "ef" * 16, "spanId": "01" * 8, "name": "s", "kind": 1,
            "startTimeUnixNano": "1", "endTimeUnixNano": "2", "attributes": attrs}]}]}]}
        assert httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
        sc.flush()
    finally:
        sc.kill()
    from relyscope.store import Store

    st = Store(f"chdb://{tmp_path}/data")
    try:
        attrs, flags = st.query("SELECT SpanAttributes, RelyscopeFlags FROM {db}.otel_traces FINAL")[0]
    finally:
        st.close()
    assert attrs == {"k0": "abcde", "k1": "abcde", "k2": "abcde"}  # first 3 kept, each cut to 5
    assert {"dropped_attributes", "truncated_attribute"} <= set(flags)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI needed to make a test certificate")
def test_tls_on_both_otlp_endpoints(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_TLS_CERT_FILE": str(cert), "RELYSCOPE_TLS_KEY_FILE": str(key)})
    try:
        tp = TracerProvider(resource=Resource.create({"service.name": "tls-agent"}))
        tp.add_span_processor(SimpleSpanProcessor(GrpcExporter(
            endpoint=f"localhost:{sc.grpc_port}", credentials=_grpc_creds(cert))))
        tp.add_span_processor(SimpleSpanProcessor(HttpExporter(
            endpoint=f"https://localhost:{sc.http_port}/v1/traces", certificate_file=str(cert))))
        tracer = tp.get_tracer("t")
        with tracer.start_as_current_span("invoke_agent tls-agent") as s:
            s.set_attribute("gen_ai.operation.name", "invoke_agent")
        tp.shutdown()
        # both exporters delivered the same span; it is stored once
        deadline = time.monotonic() + 20
        counts = {}
        while time.monotonic() < deadline:
            counts = httpx.get(f"https://localhost:{sc.api_port}/api/v1/spans", verify=ssl.create_default_context(cafile=str(cert)), timeout=10).json()
            if counts.get("spans") == 1 and counts.get("rows", 0) >= 1:
                break
            time.sleep(0.3)
        assert counts["spans"] == 1
        # plain HTTP to the TLS port fails
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{sc.http_port}/v1/traces", content=b"", timeout=5)
    finally:
        sc.kill()


def _grpc_creds(cert):
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())


def test_redaction_covers_events_and_resource():
    """A reviewer's repro: prompts sent as GenAI events (gen_ai.user.message content) and
    exception messages were stored unredacted; only span attributes were filtered."""
    from relyscope.model import SpanEvent

    card = "4111-1111-1111-1111"
    span = CanonicalSpan(
        trace_id="1" * 32, span_id="2" * 16, parent_span_id="", name="chat m", kind=3, start_ns=1, end_ns=2,
        attributes={}, resource={"service.name": "a", "host.name": "secret-host"},
        events=(SpanEvent("gen_ai.content.prompt", 1, {"gen_ai.prompt": f"card {card}"}),
                SpanEvent("gen_ai.user.message", 1, {"content": f"card {card}"})))
    out = Redactor(deny=["gen_ai.prompt*", "host.name"], patterns=[r"\b(?:\d{4}-){3}\d{4}\b"]).apply(span)
    assert out.events[0].attributes == {}
    assert out.events[1].attributes == {"content": f"card {MASK}"}
    assert out.resource == {"service.name": "a"}
