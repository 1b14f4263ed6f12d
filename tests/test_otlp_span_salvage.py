"""One span that cannot be parsed no longer fails its whole protobuf request. upb refuses a
message nested past its depth limit (100) and bytes that are not a message; a request holding one
good span and one whose attribute is a key-value list nested 32 deep (3 message levels each) was
answered 400 / INVALID_ARGUMENT for both — the same payload as OTLP/JSON was kept. Now the
request is parsed with its spans as byte strings and each span alone: a span a lone parse takes
(32 deep: 3 levels shallower than inside the request) is kept, one it refuses (40 deep, garbage
bytes) is rejected with its reason (OTLP partial success) and the rest of the batch is stored."""

from __future__ import annotations

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from relyscope.collector.otlp import OTLPRequestError, decode_http, decode_request, deserialize_request, validate_http

PB = "application/x-protobuf"


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])


def _ld(field: int, data: bytes) -> bytes:
    """A length-delimited field: tag (field << 3 | 2), length, bytes (protobuf encoding guide)."""
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _span(n: int, name: str = "good") -> bytes:
    return Span(trace_id=bytes([n]) * 16, span_id=bytes([n]) * 8, name=name,
                start_time_unix_nano=1, end_time_unix_nano=2).SerializeToString()


def _deep(n: int, depth: int) -> bytes:
    """Span ``n`` with attribute ``k`` = {"k": {"k": … "x"}}, ``depth`` kvlist levels (each one
    AnyValue → KeyValueList → KeyValue: 3 message levels)."""
    inner = AnyValue(string_value="x").SerializeToString()
    for _ in range(depth):
        inner = _ld(6, _ld(1, _ld(1, b"k") + _ld(2, inner)))  # AnyValue.kvlist_value = 6
    return _span(n, "deep") + _ld(9, _ld(1, b"k") + _ld(2, inner))  # Span.attributes = 9


def _request(*spans: bytes, resource: bytes = b"") -> bytes:
    scope = b"".join(_ld(2, s) for s in spans)  # ScopeSpans.spans = 2
    rs = (_ld(1, resource) if resource else b"") + _ld(2, scope)  # ResourceSpans.resource / scope_spans
    return _ld(1, rs)  # ExportTraceServiceRequest.resource_spans = 1


def _both(body: bytes):
    """decode_http, with validate_http (the receiver's reply) and the gRPC deserializer agreeing."""
    d = decode_http(body, PB, None)
    g = decode_request(deserialize_request(body))
    assert (g.spans, g.errors, g.rejected_by_reason) == (d.spans, d.errors, d.rejected_by_reason)
    v = validate_http(body, PB, None)
    assert (v.accepted, v.rejected, list(v.errors), +v.rejected_by_reason) == (
        len(d.spans), d.rejected, d.errors, +d.rejected_by_reason)
    return d


def test_a_span_at_the_depth_limit_is_kept_with_its_batch():
    d = _both(_request(_span(1), _deep(2, 32)))
    assert sorted(s.name for s in d.spans) == ["deep", "good"] and d.rejected == 0


@pytest.mark.parametrize("bad, why", [
    (_deep(2, 40), "MaxDepth"),
    (b"\xff\xff\xff\xff", "cannot decode span"),  # not a message: a tag with no end
])
def test_an_undecodable_span_is_rejected_alone(bad, why):
    d = _both(_request(_span(1), bad, _span(3)))
    assert sorted(s.span_id for s in d.spans) == ["01" * 8, "03" * 8]
    assert d.rejected == 1 and d.rejected_by_reason == {"malformed": 1}
    assert d.errors[0].startswith("span 1 (scope 0) of resource 0: cannot decode span") and why in d.errors[0]


def test_invalid_utf8_next_to_an_undecodable_span_is_still_repaired():
    body = _request(_span(1, "QQQQ").replace(b"QQQQ", b"Q\xffQQ"), _deep(2, 40),
                    resource=_ld(1, _ld(1, b"service.name") + _ld(2, _ld(1, b"s\xfe"))))
    d = _both(body)
    (s,) = d.spans
    assert s.name == "Q\ufffdQQ" and s.resource == {"service.name": "s\ufffd"}
    assert "invalid_utf8" in s.flags and d.rejected == 1


def test_a_broken_envelope_is_still_a_request_error():
    body = _request(_span(1), _deep(2, 40))
    with pytest.raises(OTLPRequestError) as e:
        validate_http(body[:-3], PB, None)  # truncated: the envelope's lengths run past the end
    assert e.value.http_status == 400
