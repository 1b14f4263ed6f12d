"""``validate_http`` must answer exactly what ``decode_http`` answers (the oracle), on every input.

The receiver acknowledges a request from ``validate_http`` (accepted / rejected counts, reasons) and
the worker decodes the spooled bytes later with ``decode_http``; a difference would tell a client a
span was accepted that is then dropped, or the reverse. Property tests generate protobuf and
OTLP/JSON requests whose ids are valid, missing, short, long, all-zero, duplicated, non-strings,
base64 or uppercase; with invalid UTF-8 (the lenient protobuf fallback); then mutate the bytes
(bit flips, truncation, insertion) and compress some; both functions get the same input.
"""

from __future__ import annotations

import base64
import collections
import gzip
import json
import random
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from relyscope.collector.otlp import (
    Limits,
    OTLPRequestError,
    Validation,
    decode_http,
    encode_response,
    validate_http,
)

PB = "application/x-protobuf"
JS = "application/json"
PROPS = settings(max_examples=150, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL = Limits(max_body_bytes=1 << 16, max_attributes=3, max_attribute_length=8, max_events=1)
MARK = b"QQQQ"  # a string value replaced by invalid UTF-8 of the same length after serializing


def assert_same(body: bytes, ctype: str | None, enc: str | None, limits: Limits = Limits()) -> Validation | None:
    """validate_http == decode_http on one input (result fields, or the error raised)."""
    try:
        d = decode_http(body, ctype, enc, limits)
    except OTLPRequestError as exc:
        with pytest.raises(OTLPRequestError) as got:
            validate_http(body, ctype, enc, limits)
        assert (got.value.http_status, got.value.grpc_code, got.value.message) == (
            exc.http_status, exc.grpc_code, exc.message)
        return None
    v = validate_http(body, ctype, enc, limits)
    assert v.accepted == len(d.spans)
    assert v.rejected == d.rejected
    assert list(v.errors) == d.errors
    assert +v.rejected_by_reason == +d.rejected_by_reason
    assert v.error_message() == d.error_message()
    for js in (False, True):
        assert encode_response(v, json=js) == encode_response(d, json=js)
    return v


# ---- hand-worked cases -------------------------------------------------------------------------

T1, T2 = bytes(range(1, 17)), bytes(range(17, 33))


def _req(spans: list[tuple[bytes, bytes]], *, resources: int = 1) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(resources):
        ss = req.resource_spans.add().scope_spans.add()
        for tid, sid in spans:
            sp = ss.spans.add(trace_id=tid, span_id=sid, name="s", kind=1, start_time_unix_nano=1,
                              end_time_unix_nano=2)
            sp.attributes.add(key="k").value.string_value = MARK.decode()
    return req


MIXED = [
    (T1, b"\x01" * 8),          # ok
    (T1, b"\x02" * 8),          # ok
    (T1, b"\x02" * 8),          # duplicate of the previous: accepted once, never rejected
    (b"", b"\x03" * 8),         # trace id missing
    (T2, b"\x04" * 4),          # span id of 4 bytes
    (bytes(16), b"\x05" * 8),   # trace id all zeros
    (T2, bytes(8)),             # span id all zeros
    (T2 + b"\x00", b""),        # trace id 17 bytes (checked before the missing span id)
]
# by hand: 2 distinct accepted keys, 5 rejected
MIXED_REASONS = {"trace_id_missing": 1, "span_id_invalid": 1, "trace_id_zero": 1, "span_id_zero": 1,
                 "trace_id_invalid": 1}


def test_mixed_batch_counts_by_hand():
    v = assert_same(_req(MIXED).SerializeToString(), PB, None)
    assert (v.accepted, v.rejected) == (2, 5)
    assert dict(v.rejected_by_reason) == MIXED_REASONS
    assert v.errors[0] == "span 3 (scope 0) of resource 0: traceId missing"
    assert v.errors[1] == "span 4 (scope 0) of resource 0: spanId has 4 bytes, expected 8"
    assert v.errors[4] == "span 7 (scope 0) of resource 0: traceId has 17 bytes, expected 16"
    assert v.decoded is None


def test_same_keys_in_two_resources_count_once():
    v = assert_same(_req(MIXED, resources=2).SerializeToString(), PB, None)
    assert (v.accepted, v.rejected) == (2, 10)


def test_invalid_utf8_takes_the_lenient_path_with_the_same_answer():
    raw = _req(MIXED).SerializeToString().replace(MARK, b"\xff\xfe\xc3Q")
    with pytest.raises(Exception):
        ExportTraceServiceRequest.FromString(raw)  # the strict parser refuses it
    v = assert_same(raw, PB, None)
    assert (v.accepted, v.rejected) == (2, 5)


@pytest.mark.parametrize("enc,pack", [("gzip", gzip.compress), ("deflate", zlib.compress),
                                      ("identity", lambda b: b)])
def test_compressed(enc, pack):
    v = assert_same(pack(_req(MIXED).SerializeToString()), PB + "; charset=utf-8", enc)
    assert (v.accepted, v.rejected) == (2, 5)


def test_json_returns_the_full_decode():
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": T1.hex(), "spanId": "01" * 8},
        {"traceId": T1.hex().upper(), "spanId": base64.b64encode(b"\x02" * 8).decode()},
        {"traceId": T1.hex(), "spanId": 7},   # not a string: invalid
        "not a span",                          # malformed
        {"spanId": "03" * 8},                  # trace id missing
    ]}]}]}
    v = assert_same(json.dumps(doc).encode(), JS, None)
    assert (v.accepted, v.rejected) == (2, 3)
    assert dict(v.rejected_by_reason) == {"span_id_invalid": 1, "malformed": 1, "trace_id_missing": 1}
    assert v.decoded is not None and len(v.decoded.spans) == 2


@pytest.mark.parametrize("body,ctype,enc,status", [
    (b"", "text/plain", None, 415),
    (b"\x0a\x05", PB, None, 400),                  # truncated length-delimited field
    (b"\x1f\x8b\x08garbage", PB, "gzip", 400),
    (b"x" * 70_000, PB, None, 413),
    (b"{}", PB, "br", 415),
    (b"[1, 2]", JS, None, 400),
])
def test_request_errors_are_the_same(body, ctype, enc, status):
    assert assert_same(body, ctype, enc, SMALL) is None
    with pytest.raises(OTLPRequestError) as e:
        validate_http(body, ctype, enc, SMALL)
    assert e.value.http_status == status


def test_empty_protobuf_body_accepts_nothing():
    v = assert_same(b"", PB, None)
    assert (v.accepted, v.rejected, v.errors) == (0, 0, ())


# ---- generated requests ------------------------------------------------------------------------

_ID16 = st.one_of(st.binary(min_size=16, max_size=16), st.just(b""), st.just(bytes(16)),
                  st.binary(min_size=1, max_size=20), st.sampled_from([T1, T2]))
_ID8 = st.one_of(st.binary(min_size=8, max_size=8), st.just(b""), st.just(bytes(8)),
                 st.binary(min_size=1, max_size=10), st.sampled_from([b"\x01" * 8, b"\x02" * 8]))
_SPAN = st.tuples(_ID16, _ID8, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                  st.integers(0, 7), st.lists(st.tuples(st.sampled_from("abcd"),
                                                        st.one_of(st.text(max_size=12),
                                                                  st.integers(-(2**63), 2**63 - 1),
                                                                  st.booleans(), st.floats())),
                                              max_size=5),
                  st.booleans())  # bad utf-8 in the name
_SHAPE = st.lists(st.lists(st.lists(_SPAN, max_size=6), max_size=3), max_size=3)


def _build(shape) -> bytes:
    req = ExportTraceServiceRequest()
    for scopes in shape:
        rs = req.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = "svc"
        for spans in scopes:
            ss = rs.scope_spans.add()
            ss.scope.name = "scope"
            for tid, sid, t0, t1, kind, attrs, bad in spans:
                sp = ss.spans.add(trace_id=tid, span_id=sid, start_time_unix_nano=t0,
                                  end_time_unix_nano=t1, kind=kind,
                                  name=MARK.decode() if bad else "op")
                for k, x in attrs:
                    av = sp.attributes.add(key=k).value
                    if isinstance(x, str):
                        av.string_value = x
                    elif isinstance(x, bool):
                        av.bool_value = x
                    elif isinstance(x, int):
                        av.int_value = x
                    else:
                        av.double_value = x
    return req.SerializeToString().replace(MARK, b"\xc3\x28\xa0\xa1")


def _mutate(data: bytes, rnd: random.Random, n: int) -> bytes:
    b = bytearray(data)
    for _ in range(n):
        op = rnd.randrange(4)
        if op == 0 and b:
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        elif op == 1 and b:
            del b[rnd.randrange(len(b)):]
        elif op == 2:
            i = rnd.randrange(len(b) + 1)
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 5)))
        elif b:
            i = rnd.randrange(len(b))
            del b[i:i + rnd.randrange(1, 4)]
    return bytes(b)


@PROPS
@given(shape=_SHAPE)
def test_generated_protobuf_same_answer(shape):
    assert_same(_build(shape), PB, None)
    assert_same(_build(shape), PB, None, SMALL)


@PROPS
@given(shape=_SHAPE, seed=st.integers(0, 2**32 - 1), n=st.integers(0, 6),
       enc=st.sampled_from([None, "gzip", "zstd"]))
def test_mutated_protobuf_same_answer(shape, seed, n, enc):
    body = _mutate(_build(shape), random.Random(seed), n)
    if enc == "gzip":
        body = gzip.compress(body)
    elif enc == "zstd":
        import zstandard
        body = zstandard.ZstdCompressor().compress(body)
    assert_same(body, PB, enc, SMALL)


@PROPS
@given(body=st.binary(max_size=512))
def test_random_bytes_same_answer(body):
    assert_same(body, PB, None)


_JID = st.one_of(st.none(), st.just(""), st.integers(), st.binary(min_size=0, max_size=17).map(bytes.hex),
                 st.binary(min_size=16, max_size=16).map(lambda b: b.hex().upper()),
                 st.binary(min_size=8, max_size=16).map(lambda b: base64.b64encode(b).decode()),
                 st.just("0" * 32), st.just("0" * 16), st.text(max_size=34))
_JVAL = st.one_of(st.text(max_size=8), st.integers(), st.just("9" * 5000), st.none(), st.lists(st.integers(), max_size=2))
_JSPAN = st.one_of(
    st.fixed_dictionaries({"traceId": _JID, "spanId": _JID},
                          optional={"trace_id": _JID, "parentSpanId": _JID, "kind": _JVAL,
                                    "startTimeUnixNano": _JVAL, "endTimeUnixNano": _JVAL,
                                    "name": _JVAL, "status": st.one_of(_JVAL, st.just({"code": 2})),
                                    "attributes": st.lists(st.fixed_dictionaries(
                                        {"key": st.text(max_size=3), "value": st.dictionaries(
                                            st.sampled_from(["stringValue", "intValue", "boolValue",
                                                             "doubleValue", "bytesValue"]),
                                            _JVAL, max_size=2)}), max_size=3)}),
    _JVAL)
_JDOC = st.fixed_dictionaries({"resourceSpans": st.one_of(
    st.lists(st.one_of(st.fixed_dictionaries(
        {"resource": st.one_of(st.none(), st.just({"attributes": []}), _JVAL),
         "scopeSpans": st.one_of(st.lists(st.one_of(
             st.fixed_dictionaries({"spans": st.one_of(st.lists(_JSPAN, max_size=5), _JVAL)}),
             _JVAL), max_size=3), _JVAL)}), _JVAL), max_size=3),
    _JVAL)})


@PROPS
@given(doc=_JDOC, seed=st.integers(0, 2**32 - 1), n=st.integers(0, 3), bad_utf8=st.booleans())
def test_generated_json_same_answer(doc, seed, n, bad_utf8):
    body = json.dumps(doc).encode()
    if bad_utf8:
        body = body.replace(b'"name"', b'"n\xffme"')
    assert_same(body, JS, None)
    assert_same(_mutate(body, random.Random(seed), n), JS, None, SMALL)


def test_validation_counter_type():
    v = validate_http(_req(MIXED).SerializeToString(), PB, None)
    assert isinstance(v.rejected_by_reason, collections.Counter)
