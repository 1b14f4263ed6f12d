"""Function-level tests of the OTLP decoding edge (relyscope.collector.otlp).

Bug cases C05-C12 come from /work/shared/data/bugcases (each file says what is sent and what a
correct receiver does). Expected values are read off the case files by hand, computed with
reference tools (coreutils `base64 -d`, the OTel SDK's own span objects), or follow from the OTLP
spec; none are copied from the decoder's output.
"""

from __future__ import annotations

import base64
import gzip
import json
import tracemalloc
import zlib

import pytest
import zstandard
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from relyscope.collector.otlp import (
    DecodeResult,
    Limits,
    OTLPRequestError,
    decode_http,
    decode_json,
    decode_request,
    deserialize_request,
    encode_response,
    encode_status,
)
from relyscope.model import CanonicalSpan, SpanEvent
from conftest import DATA

BUGCASES = (DATA / "bugcases")
JSON_CT = "application/json"
PB_CT = "application/x-protobuf"
TRACE = "5b8efff798038103d269b633813fc60c"


def _case(name: str) -> dict:
    return json.loads((BUGCASES / f"{name}.json").read_text())


def _body(req: dict) -> bytes:
    if "body_file" in req:
        return (BUGCASES / req["body_file"]).read_bytes()
    return json.dumps(req["body"]).encode()


def _send(req: dict, limits: Limits = Limits()) -> DecodeResult:
    h = req["headers"]
    return decode_http(_body(req), h.get("Content-Type"), h.get("Content-Encoding"), limits)


def _by_id(res: DecodeResult) -> dict[str, CanonicalSpan]:
    return {s.span_id: s for s in res.spans}


def _json_span(span_id: str | None = "a1a1a1a1a1a1a1a1", **fields) -> dict:
    sp = {"traceId": TRACE, "name": "s", "kind": 1,
          "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000"}
    if span_id is not None:
        sp["spanId"] = span_id
    sp.update(fields)
    return sp


def _json_body(*spans: dict, resource_attrs: list | None = None) -> bytes:
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": resource_attrs or []},
        "scopeSpans": [{"scope": {"name": "sc", "version": "1"}, "spans": list(spans)}]}]}).encode()


def _pb_request(n: int = 2, attr: str = "MARKER") -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "svc"
    ss = rs.scope_spans.add()
    ss.scope.name = "sc"
    for i in range(n):
        sp = ss.spans.add()
        sp.trace_id = bytes(range(1, 17))
        sp.span_id = bytes([i + 1]) * 8
        sp.name = "n"
        sp.kind = 3
        sp.start_time_unix_nano, sp.end_time_unix_nano = 5, 9
        a = sp.attributes.add()
        a.key, a.value.string_value = "k", attr
    return req


# --------------------------------------------------------------------------------------------------
# Bug cases C05-C12
# --------------------------------------------------------------------------------------------------


def test_c05_retry_decodes_identically_each_time():
    first, retry = (_send(r) for r in _case("C05_retry_duplicates")["requests"])
    assert first.spans == retry.spans
    assert first.rejected == 0 and retry.rejected == 0
    spans = _by_id(first)
    assert set(spans) == {"a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2", "c3c3c3c3c3c3c3c3"}
    chat = spans["b2b2b2b2b2b2b2b2"]
    assert chat.trace_id == TRACE
    assert chat.parent_span_id == "a1a1a1a1a1a1a1a1"
    assert chat.kind == 3 and chat.status_code == 1
    assert chat.start_ns == 1760000001000000000 and chat.end_ns == 1760000003000000000
    assert chat.attributes["gen_ai.usage.input_tokens"] == 812  # intValue "812" -> int
    assert chat.resource == {"service.name": "support-agent"}
    assert (chat.scope_name, chat.scope_version) == ("sketch.genai", "0.1")
    assert spans["a1a1a1a1a1a1a1a1"].parent_span_id == ""


def test_c06_duplicate_in_batch_keeps_last_copy_and_rest_of_batch():
    res = _send(_case("C06_duplicate_span_id_in_batch")["requests"][0])
    assert res.rejected == 0 and res.errors == []
    assert res.warnings["duplicate_in_batch"] == 1
    assert [s.span_id for s in res.spans].count("c3c3c3c3c3c3c3c3") == 1
    spans = _by_id(res)
    assert set(spans) == {"a1a1a1a1a1a1a1a1", "c3c3c3c3c3c3c3c3"}
    tool = spans["c3c3c3c3c3c3c3c3"]
    assert tool.end_ns == 1760000004100000000  # the second (last) copy
    assert tool.attributes["gen_ai.tool.call.result"] == '{"status":"delivered"}'


def test_c07_end_before_start_clamped_and_raw_end_kept():
    res = _send(_case("C07_end_before_start")["requests"][0])
    assert res.rejected == 0
    spans = _by_id(res)
    chat = spans["b2b2b2b2b2b2b2b2"]
    assert chat.start_ns == chat.end_ns == 1760000003000000000
    assert chat.duration_ns == 0
    assert chat.raw_end_ns == 1760000001000000000
    assert "end_before_start" in chat.flags
    tool = spans["c3c3c3c3c3c3c3c3"]  # end = 0 (unset)
    assert tool.end_ns == tool.start_ns == 1760000003500000000
    assert tool.raw_end_ns == 0
    assert {"end_before_start", "missing_end"} <= tool.flags
    root = spans["a1a1a1a1a1a1a1a1"]
    assert root.raw_end_ns is None and root.flags == frozenset()
    assert res.warnings["end_before_start"] == 2


def test_c08_invalid_utf8_json_body_replaced_not_failed():
    reqs = _case("C08_invalid_utf8")["requests"]
    res = _send(reqs[0])
    assert res.rejected == 0
    spans = _by_id(res)
    assert set(spans) == {"a1a1a1a1a1a1a1a1", "c3c3c3c3c3c3c3c3"}
    tool = spans["c3c3c3c3c3c3c3c3"]
    # body bytes E4 BD A0 = U+4F60; E5 A5 is a truncated 3-byte sequence -> one U+FFFD
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"note":"\u4f60\ufffd"}'
    assert "invalid_utf8" in tool.flags
    assert "invalid_utf8" not in spans["a1a1a1a1a1a1a1a1"].flags
    assert res.warnings["invalid_utf8"] == 1
    # the second request of the case is a fragment (no resourceSpans): nothing this endpoint can
    # read, so a clear 400 rather than a silent 200 (issue 11)
    with pytest.raises(OTLPRequestError) as err:
        _send(reqs[1])
    assert err.value.http_status == 400 and "no resourceSpans" in err.value.message


def test_c08_lone_surrogate_escape_replaced_and_reencodable():
    raw = _json_body(_json_span(attributes=[
        {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": "PLACEHOLDER"}}]))
    body = raw.replace(b"PLACEHOLDER", b'{\\"q\\":\\"\\ud800\\"}')
    assert b"\\ud800" in body
    res = decode_http(body, JSON_CT, None)
    (span,) = res.spans
    value = span.attributes["gen_ai.tool.call.arguments"]
    assert value == '{"q":"\ufffd"}'
    value.encode("utf-8")  # must not raise
    assert "invalid_utf8" in span.flags


def test_valid_surrogate_pair_escape_is_not_flagged():
    body = _json_body(_json_span(name="PLACEHOLDER")).replace(b"PLACEHOLDER", b"\\ud83d\\ude00")
    (span,) = decode_http(body, JSON_CT, None).spans
    assert span.name == "\U0001F600" and span.flags == frozenset()


def test_c08_invalid_utf8_in_protobuf_string_value():
    body = _pb_request(2).SerializeToString().replace(b"MARKER", b"\xe4\xbd\xa0\xe5\xa5X", 1)
    with pytest.raises(Exception):  # upb itself refuses the body: that is the bug C08 describes
        ExportTraceServiceRequest.FromString(body)
    for res in (decode_http(body, PB_CT, None), decode_request(deserialize_request(body))):
        assert res.rejected == 0 and len(res.spans) == 2
        first, second = res.spans
        assert first.attributes == {"k": "\u4f60\ufffdX"}
        assert first.flags == frozenset({"invalid_utf8"})
        assert second.attributes == {"k": "MARKER"} and second.flags == frozenset()
        assert first.resource == {"service.name": "svc"}


def test_c09_base64_ids_snake_case_and_big_numbers():
    r1, r2 = _case("C09_base64_ids_in_json")["requests"]
    res = _send(r1)
    (span,) = res.spans
    # `echo Z6z8LqVvEI+kU1/Ci6mXBQ== | base64 -d | xxd -p` and `echo gMEgDJS+EXg= | ...`
    assert span.trace_id == "67acfc2ea56f108fa4535fc28ba99705"
    assert span.span_id == "80c1200c94be1178"
    assert span.start_ns == 1697982593201336000  # > 2^53: no float rounding
    assert span.end_ns == 1697982593201347750
    assert res.warnings["base64_id"] == 2 and res.warnings["snake_case_keys"] >= 4
    res = _send(r2)
    (span,) = res.spans
    assert span.trace_id == TRACE and span.span_id == "eee19b7ec3c1b174"
    assert span.start_ns == 1544712660000000000 and span.end_ns == 1544712661000000000
    assert res.warnings["uppercase_hex"] == 2


def test_c10_gzip_json_body():
    res = _send(_case("C10_gzip_body")["requests"][0])
    assert res.rejected == 0
    assert set(_by_id(res)) == {"a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2"}


def _sdk_spans() -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "eq-test",
                                                        "service.version": "2.1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("relyscope.test", "0.3")
    with tracer.start_as_current_span("invoke_agent bot", kind=SpanKind.INTERNAL,
                                      attributes={"gen_ai.operation.name": "invoke_agent",
                                                  "gen_ai.invocation.is_nested": False}) as root:
        with tracer.start_as_current_span(
                "chat gpt-4o", kind=SpanKind.CLIENT,
                attributes={"gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 812,
                            "gen_ai.request.temperature": 0.25,
                            "gen_ai.response.finish_reasons": ["stop", "length"],
                            "relyscope.scores": [1, 2, 3], "big": 2**53 + 1}) as chat:
            chat.add_event("gen_ai.evaluation.result",
                           {"gen_ai.evaluation.name": "relevance",
                            "gen_ai.evaluation.score.value": 0.5})
        with tracer.start_as_current_span("execute_tool lookup",
                                          links=[Link(root.get_span_context())]) as tool:
            tool.set_attribute("gen_ai.tool.name", "lookup")
            tool.set_status(Status(StatusCode.ERROR, "tool failed"))
    provider.shutdown()
    return list(exporter.get_finished_spans())


_OTLP_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4,
              SpanKind.CONSUMER: 5}  # OTLP Span.SpanKind numbering
_OTLP_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def _plain(attrs) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()}


def _expected(sdk_span) -> CanonicalSpan:
    """The CanonicalSpan an SDK span must decode to, built from the SDK's own objects."""
    ctx = sdk_span.context
    return CanonicalSpan(
        trace_id=format(ctx.trace_id, "032x"), span_id=format(ctx.span_id, "016x"),
        parent_span_id=format(sdk_span.parent.span_id, "016x") if sdk_span.parent else "",
        name=sdk_span.name, kind=_OTLP_KIND[sdk_span.kind], start_ns=sdk_span.start_time,
        end_ns=sdk_span.end_time, status_code=_OTLP_STATUS[sdk_span.status.status_code],
        status_message=sdk_span.status.description or "",
        attributes=_plain(sdk_span.attributes), resource=_plain(sdk_span.resource.attributes),
        scope_name=sdk_span.instrumentation_scope.name,
        scope_version=sdk_span.instrumentation_scope.version,
        events=tuple(SpanEvent(e.name, e.timestamp, _plain(e.attributes)) for e in sdk_span.events),
        links=tuple((format(lk.context.trace_id, "032x"), format(lk.context.span_id, "016x"))
                    for lk in sdk_span.links),
        trace_state=ctx.trace_state.to_header())


def test_c10_gzip_protobuf_body_from_sdk_encoder():
    sdk = _sdk_spans()
    body = encode_spans(sdk).SerializeToString()
    res = decode_http(gzip.compress(body), PB_CT, "gzip")
    assert res.rejected == 0
    assert sorted(res.spans, key=lambda s: s.span_id) == sorted(map(_expected, sdk),
                                                                key=lambda s: s.span_id)


@pytest.mark.parametrize("encoding,compress", [
    ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b, wbits=-15)),  # raw deflate, as some clients send
    ("zstd", lambda b: zstandard.ZstdCompressor().compress(b)),
    ("GZIP", gzip.compress),
    ("identity", lambda b: b),
])
def test_other_content_encodings(encoding, compress):
    sdk = _sdk_spans()
    body = encode_spans(sdk).SerializeToString()
    res = decode_http(compress(body), PB_CT, encoding)
    assert {s.span_id for s in res.spans} == {format(s.context.span_id, "016x") for s in sdk}


@pytest.mark.parametrize("encoding,body", [
    ("gzip", b"\x1f\x8b\x08\x00garbage-after-a-gzip-magic"),
    ("gzip", gzip.compress(b'{"resourceSpans": []}')[:-6]),  # truncated
    ("gzip", b'{"resourceSpans": []}'),  # not compressed at all
    ("deflate", b"\xff\xfe not deflate"),
    ("zstd", zstandard.ZstdCompressor().compress(b'{"resourceSpans": []}')[:-4]),
    ("zstd", b"not zstd"),
])
def test_bad_compressed_data_is_400(encoding, body):
    with pytest.raises(OTLPRequestError) as exc:
        decode_http(body, JSON_CT, encoding)
    assert exc.value.http_status == 400 and exc.value.grpc_code == "INVALID_ARGUMENT"


def _huge_body(n_bytes: int) -> tuple[bytes, str]:
    text = ("The quick brown fox jumps over the lazy dog. " * (n_bytes // 45 + 1))[:n_bytes]
    body = _json_body(
        _json_span("a1a1a1a1a1a1a1a1", name="invoke_agent bot"),
        _json_span("b2b2b2b2b2b2b2b2", name="chat", parentSpanId="a1a1a1a1a1a1a1a1",
                   attributes=[{"key": "gen_ai.input.messages", "value": {"stringValue": text}}]))
    return body, text


def test_c11_six_mib_attribute_over_limit_is_413_naming_the_limit():
    body, _ = _huge_body(6 << 20)
    with pytest.raises(OTLPRequestError) as exc:
        decode_http(body, JSON_CT, None, Limits(max_body_bytes=4 << 20))
    assert exc.value.http_status == 413
    assert "4194304" in exc.value.message  # 4 MiB in bytes


def test_c11_six_mib_attribute_under_default_limit_accepted_intact():
    body, text = _huge_body(6 << 20)
    res = decode_http(body, JSON_CT, None)
    assert res.rejected == 0
    spans = _by_id(res)
    assert set(spans) == {"a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2"}
    value = spans["b2b2b2b2b2b2b2b2"].attributes["gen_ai.input.messages"]
    assert len(value) == 6 << 20 and value == text


def test_c11_attribute_length_limit_truncates_and_flags():
    body, text = _huge_body(6 << 20)
    res = decode_http(body, JSON_CT, None, Limits(max_attribute_length=1000))
    chat = _by_id(res)["b2b2b2b2b2b2b2b2"]
    assert chat.attributes["gen_ai.input.messages"] == text[:1000]
    assert "truncated_attribute" in chat.flags
    assert "truncated_attribute" not in _by_id(res)["a1a1a1a1a1a1a1a1"].flags


def test_c12_partial_success_reports_rejected_span():
    res = _send(_case("C12_partial_success_silent_drop")["requests"][0])
    assert res.rejected == 1
    assert set(_by_id(res)) == {"a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2"}
    assert len(res.errors) == 1 and "spanId missing" in res.errors[0]
    assert "span 2" in res.errors[0]
    doc = json.loads(encode_response(res, json=True))
    assert doc["partialSuccess"]["rejectedSpans"] in ("1", 1)
    assert "spanId" in doc["partialSuccess"]["errorMessage"]
    pb = ExportTraceServiceResponse.FromString(encode_response(res, json=False))
    assert pb.partial_success.rejected_spans == 1
    assert "spanId" in pb.partial_success.error_message


def test_clean_result_encodes_empty_response():
    res = _send(_case("C05_retry_duplicates")["requests"][0])
    assert json.loads(encode_response(res, json=True)) == {}
    assert not ExportTraceServiceResponse.FromString(
        encode_response(res, json=False)).HasField("partial_success")


# --------------------------------------------------------------------------------------------------
# Protobuf / JSON equivalence (SDK-built spans)
# --------------------------------------------------------------------------------------------------


def _hex_ids_json(req: ExportTraceServiceRequest) -> bytes:
    """Spec OTLP/JSON: lowercase hex ids and integer enums (json_format alone gives base64)."""
    doc = json_format.MessageToDict(req, use_integers_for_enums=True)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64decode(sp[k]).hex()
                for lk in sp.get("links", []):
                    for k in ("traceId", "spanId"):
                        lk[k] = base64.b64decode(lk[k]).hex()
    return json.dumps(doc).encode()


def test_protobuf_and_json_decode_to_equal_canonical_spans():
    sdk = _sdk_spans()
    req = encode_spans(sdk)
    expected = sorted(map(_expected, sdk), key=lambda s: s.span_id)
    bodies = {
        "protobuf": (req.SerializeToString(), PB_CT),
        "json hex ids": (_hex_ids_json(req), JSON_CT),
        "json_format (base64 ids, enum names)": (json_format.MessageToJson(req).encode(), JSON_CT),
        "json_format snake_case": (json_format.MessageToJson(
            req, preserving_proto_field_name=True).encode(), JSON_CT),
    }
    for label, (body, ct) in bodies.items():
        res = decode_http(body, ct + "; charset=utf-8", None)
        assert res.rejected == 0, label
        assert sorted(res.spans, key=lambda s: s.span_id) == expected, label
    via_grpc = decode_request(req)
    assert sorted(via_grpc.spans, key=lambda s: s.span_id) == expected
    chat = next(s for s in expected if s.name == "chat gpt-4o")
    assert chat.attributes["big"] == 2**53 + 1
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["stop", "length"]
    enum_warnings = decode_http(bodies["json_format (base64 ids, enum names)"][0], JSON_CT,
                                None).warnings
    assert enum_warnings["enum_name"] >= 3 and enum_warnings["base64_id"] >= 6


# --------------------------------------------------------------------------------------------------
# Request-level errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ct", ["text/plain", None, "", "application/xml", "application/jsonx"])
def test_unknown_content_type_is_415(ct):
    with pytest.raises(OTLPRequestError) as exc:
        decode_http(b"{}", ct, None)
    assert exc.value.http_status == 415


def test_unknown_content_encoding_is_415():
    with pytest.raises(OTLPRequestError) as exc:
        decode_http(b"{}", JSON_CT, "br")
    assert exc.value.http_status == 415


@pytest.mark.parametrize("body,ct", [
    (b"{not json", JSON_CT), (b"[1, 2]", JSON_CT), (b'{"resourceSpans": 3}', JSON_CT),
    (b"\xff\xff\xff\xff", PB_CT),
])
def test_undecodable_body_is_400(body, ct):
    with pytest.raises(OTLPRequestError) as exc:
        decode_http(body, ct, None)
    assert exc.value.http_status == 400


def test_undecodable_grpc_message_is_invalid_argument():
    marker = deserialize_request(b"\xff\xff\xff\xff")
    with pytest.raises(OTLPRequestError) as exc:
        decode_request(marker)
    assert exc.value.grpc_code == "INVALID_ARGUMENT"


def test_empty_requests_are_valid():
    assert decode_http(b"", PB_CT, None).spans == []
    assert decode_http(b"{}", JSON_CT, None).spans == []


def _bomb(decompressed: int, kind: str) -> bytes:
    """Compress `decompressed` zero bytes without ever holding them in memory."""
    chunk = bytes(1 << 20)
    if kind == "zstd":
        c = zstandard.ZstdCompressor().compressobj()
        parts = [c.compress(chunk) for _ in range(decompressed >> 20)]
        return b"".join(parts) + c.flush()
    c = zlib.compressobj(9, zlib.DEFLATED, 31 if kind == "gzip" else 15)
    parts = [c.compress(chunk) for _ in range(decompressed >> 20)]
    return b"".join(parts) + c.flush()


@pytest.mark.parametrize("kind", ["gzip", "deflate", "zstd"])
def test_compression_bomb_is_413_without_blowing_memory(kind):
    bomb = _bomb(64 << 20, kind)  # 64 MiB of zeros in well under 1 MiB
    limit = 1 << 20
    assert len(bomb) < limit
    tracemalloc.start()
    try:
        with pytest.raises(OTLPRequestError) as exc:
            decode_http(bomb, PB_CT, kind, Limits(max_body_bytes=limit))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.http_status == 413 and str(limit) in exc.value.message
    assert peak < 24 * limit  # bounded by the cap (+ one decompression step), not by 64 MiB


def test_compressed_body_over_limit_is_413_before_inflating():
    body = gzip.compress(bytes(range(256)) * 64)
    with pytest.raises(OTLPRequestError) as exc:
        decode_http(body, JSON_CT, "gzip", Limits(max_body_bytes=len(body) - 1))
    assert exc.value.http_status == 413


# --------------------------------------------------------------------------------------------------
# Per-span validation and repair
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields,reason", [
    ({"traceId": ""}, "traceId missing"),
    ({"traceId": "0" * 32}, "traceId is all zeros"),
    ({"traceId": "abc"}, "traceId invalid"),
    ({"spanId": "0000000000000000"}, "spanId is all zeros"),
    ({"spanId": "a1a1a1a1a1a1a1"}, "spanId invalid"),
    ({"spanId": "zzzzzzzzzzzzzzzz"}, "spanId invalid"),
])
def test_unusable_ids_reject_only_that_span(fields, reason):
    res = decode_http(_json_body(_json_span("b2b2b2b2b2b2b2b2"), _json_span(**fields)), JSON_CT,
                      None)
    assert res.rejected == 1 and [s.span_id for s in res.spans] == ["b2b2b2b2b2b2b2b2"]
    assert reason in res.errors[0]


def test_protobuf_wrong_length_ids_rejected():
    req = _pb_request(3)
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[0].span_id = b"\x01" * 7
    spans[1].trace_id = bytes(16)
    res = decode_request(req)
    assert res.rejected == 2 and len(res.spans) == 1
    assert "spanId has 7 bytes, expected 8" in res.errors[0]
    assert "traceId is all zeros" in res.errors[1]
    assert res.rejected_by_reason == {"span_id_invalid": 1, "trace_id_zero": 1}


@pytest.mark.parametrize("parent", ["zz", "0000000000000000", 12])
def test_invalid_parent_becomes_root_with_flag(parent):
    (span,) = decode_http(_json_body(_json_span(parentSpanId=parent)), JSON_CT, None).spans
    assert span.parent_span_id == "" and "invalid_parent_span_id" in span.flags


def test_attribute_value_kinds_json():
    attrs = [
        {"key": "s", "value": {"stringValue": "x"}},
        {"key": "i", "value": {"intValue": "9007199254740993"}},  # 2^53 + 1 exactly
        {"key": "d", "value": {"doubleValue": 0.5}},
        {"key": "b", "value": {"boolValue": True}},
        {"key": "arr", "value": {"arrayValue": {"values": [{"stringValue": "a"},
                                                           {"intValue": 2}]}}},
        {"key": "kv", "value": {"kvlistValue": {"values": [
            {"key": "inner", "value": {"boolValue": False}}]}}},
        {"key": "raw", "value": {"bytesValue": base64.b64encode(b"\x00\x01").decode()}},
        {"key": "empty", "value": {}},
        {"key": "novalue"},
    ]
    (span,) = decode_http(_json_body(_json_span(attributes=attrs)), JSON_CT, None).spans
    assert span.attributes == {"s": "x", "i": 9007199254740993, "d": 0.5, "b": True,
                               "arr": ["a", 2], "kv": {"inner": False}, "raw": b"\x00\x01",
                               "empty": None, "novalue": None}
    assert "empty_attribute" in span.flags


def test_enum_names_and_missing_kind():
    body = _json_body(_json_span(kind="SPAN_KIND_CLIENT", status={"code": "STATUS_CODE_ERROR",
                                                                  "message": "boom"}),
                      _json_span("b2b2b2b2b2b2b2b2", kind=None))
    res = decode_http(body, JSON_CT, None)
    a, b = res.spans
    assert (a.kind, a.status_code, a.status_message) == (3, 2, "boom")
    assert res.warnings["enum_name"] == 2
    assert b.kind == 0 and "missing_kind" in b.flags and "missing_kind" not in a.flags


@pytest.mark.parametrize("path", ["json", "protobuf"])
def test_max_attributes_keeps_first_n(path):
    limits = Limits(max_attributes=128)
    if path == "json":
        attrs = [{"key": f"k{i}", "value": {"intValue": str(i + 1)}} for i in range(130)]
        res = decode_http(_json_body(_json_span(attributes=attrs)), JSON_CT, None, limits)
    else:
        req = _pb_request(1)
        sp = req.resource_spans[0].scope_spans[0].spans[0]
        del sp.attributes[:]
        for i in range(130):
            kv = sp.attributes.add()
            kv.key, kv.value.int_value = f"k{i}", i + 1
        res = decode_request(req, limits)
    (span,) = res.spans
    assert span.attributes == {f"k{i}": i + 1 for i in range(128)}
    assert "dropped_attributes" in span.flags


def test_max_events_limit():
    events = [{"name": f"e{i}", "timeUnixNano": str(i)} for i in range(5)]
    (span,) = decode_http(_json_body(_json_span(events=events)), JSON_CT, None,
                          Limits(max_events=3)).spans
    assert [e.name for e in span.events] == ["e0", "e1", "e2"]
    assert "dropped_events" in span.flags


# --------------------------------------------------------------------------------------------------
# Status bodies
# --------------------------------------------------------------------------------------------------


def test_encode_status_roundtrip():
    st = status_pb2.Status.FromString(encode_status(3, "bad gzip data", json=False))
    assert (st.code, st.message) == (3, "bad gzip data")
    doc = json.loads(encode_status(3, "bad gzip data", json=True))
    assert doc == {"code": 3, "message": "bad gzip data"}


def test_error_status_body_from_exception():
    with pytest.raises(OTLPRequestError) as exc:
        decode_http(b"{}", "text/plain", None)
    st = status_pb2.Status.FromString(exc.value.status_body(json=False))
    assert st.code == 3 and "Content-Type" in st.message


def test_decode_json_accepts_text():
    (span,) = decode_json(_json_body(_json_span()).decode()).spans
    assert span.span_id == "a1a1a1a1a1a1a1a1"
