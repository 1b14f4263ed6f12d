"""Property tests: no input makes the OTLP decoder raise anything but OTLPRequestError.

Random bytes and mutated valid bodies (bit flips, truncation, insertions, key deletion, type swaps,
odd strings) go into ``decode_http``; every outcome must be a DecodeResult whose spans respect the
CanonicalSpan contract, or an OTLPRequestError with a client status (400/413/415), and the
response / status bodies built from it must parse back.
"""

from __future__ import annotations

import copy
import gzip
import json
import random

from google.protobuf import json_format
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from conftest import DATA

from relyscope.collector.normalize.versions import attribute_rank

from relyscope.collector.otlp import (
    DecodeResult,
    Limits,
    OTLPRequestError,
    decode_http,
    encode_response,
    encode_status,
)

BUGCASES = (DATA / "bugcases")
SPANS = (DATA / "spans")
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LIMITS = Limits(max_body_bytes=1 << 20, max_attributes=8, max_attribute_length=64, max_events=4)


def _seed_docs() -> list[dict]:
    docs = []
    for name in ("C05_retry_duplicates", "C06_duplicate_span_id_in_batch",
                 "C07_end_before_start", "C09_base64_ids_in_json",
                 "C12_partial_success_silent_drop"):
        for req in json.loads((BUGCASES / f"{name}.json").read_text())["requests"]:
            docs.append(req["body"])
    for path in sorted(SPANS.glob("*.otlp.json")):
        docs.append(json.loads(path.read_text()))
    return docs


SEED_DOCS = _seed_docs()


def _seed_protobuf() -> list[bytes]:
    out = []
    for doc in SEED_DOCS:
        try:
            out.append(json_format.ParseDict(doc, _request_cls()(),
                                              ignore_unknown_fields=True).SerializeToString())
        except json_format.ParseError:
            pass  # e.g. the base64/snake_case case is not protobuf-JSON parseable everywhere
    return out


def _request_cls():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    return ExportTraceServiceRequest


SEED_PB = _seed_protobuf()


def _check(body: bytes, content_type: str | None, encoding: str | None) -> None:
    try:
        res = decode_http(body, content_type, encoding, LIMITS)
    except OTLPRequestError as exc:
        assert exc.http_status in (400, 413, 415), exc.message
        st_ = status_pb2.Status.FromString(exc.status_body(json=False))
        assert st_.message == exc.message.encode("utf-8", "replace").decode("utf-8")
        json.loads(exc.status_body(json=True))
        return
    assert isinstance(res, DecodeResult)
    assert res.rejected >= 0 and len(res.errors) >= res.rejected
    keys = set()
    for s in res.spans:
        assert len(s.trace_id) == 32 and int(s.trace_id, 16) != 0 and s.trace_id == s.trace_id.lower()
        assert len(s.span_id) == 16 and int(s.span_id, 16) != 0 and s.span_id == s.span_id.lower()
        assert s.parent_span_id == "" or len(s.parent_span_id) == 16
        assert 0 <= s.start_ns <= s.end_ns
        # the count limit never drops a key scoring reads (rank 0), so those may exceed it
        n_scoring = sum(1 for k in s.attributes if attribute_rank(k) == 0)
        assert len(s.attributes) <= max(LIMITS.max_attributes, n_scoring)
        assert len(s.events) <= LIMITS.max_events
        assert s.key not in keys
        keys.add(s.key)
        for text in (s.name, s.status_message, s.scope_name, s.trace_state,
                     *[k for k in s.attributes], *[v for v in s.attributes.values()
                                                   if isinstance(v, str)]):
            text.encode("utf-8")  # every string re-encodes (no lone surrogates)
    pb = ExportTraceServiceResponse.FromString(encode_response(res, json=False))
    assert pb.partial_success.rejected_spans == res.rejected
    json.loads(encode_response(res, json=True))


CONTENT_TYPES = st.sampled_from(["application/x-protobuf", "application/json",
                                 "application/json; charset=utf-8", "text/plain", None])
ENCODINGS = st.sampled_from([None, "identity", "gzip", "deflate", "zstd", "br"])


@FUZZ
@given(body=st.binary(max_size=2048), content_type=CONTENT_TYPES, encoding=ENCODINGS)
def test_random_bytes_never_crash(body, content_type, encoding):
    _check(body, content_type, encoding)


def _mutate_bytes(data: bytes, rnd: random.Random, n: int) -> bytes:
    b = bytearray(data)
    for _ in range(n):
        op = rnd.randrange(4)
        if not b:
            b.append(rnd.randrange(256))
        elif op == 0:  # bit flip
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        elif op == 1:  # truncate
            del b[rnd.randrange(len(b)):]
        elif op == 2:  # insert random bytes
            i = rnd.randrange(len(b) + 1)
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 5)))
        else:  # overwrite a byte
            b[rnd.randrange(len(b))] = rnd.randrange(256)
    return bytes(b)


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, 10**6), n=st.integers(1, 8),
       compress=st.booleans())
def test_mutated_protobuf_never_crashes(seed, which, n, compress):
    body = _mutate_bytes(SEED_PB[which % len(SEED_PB)], random.Random(seed), n)
    if compress:
        _check(gzip.compress(body), "application/x-protobuf", "gzip")
    else:
        _check(body, "application/x-protobuf", None)


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, 10**6), n=st.integers(1, 8))
def test_mutated_json_text_never_crashes(seed, which, n):
    body = json.dumps(SEED_DOCS[which % len(SEED_DOCS)]).encode()
    _check(_mutate_bytes(body, random.Random(seed), n), "application/json", None)


JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=20),  # includes lone surrogates
    st.sampled_from(["", "0" * 32, "A1A1A1A1A1A1A1A1", "Z6z8LqVvEI+kU1/Ci6mXBQ==", "-1",
                     "18446744073709551616", "SPAN_KIND_CLIENT", "NaN"]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=10)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@FUZZ
@given(which=st.integers(0, 10**6), picks=st.lists(st.integers(0, 10**9), min_size=1, max_size=4),
       ops=st.lists(st.sampled_from(["delete", "swap"]), min_size=1, max_size=4),
       replacement=JSON_VALUES)
def test_structurally_mutated_json_never_crashes(which, picks, ops, replacement):
    doc = copy.deepcopy(SEED_DOCS[which % len(SEED_DOCS)])
    for pick, op in zip(picks, ops):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = paths[pick % len(paths)]
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        if op == "delete":
            del parent[path[-1]]
        else:  # swap the value for one of another type
            parent[path[-1]] = copy.deepcopy(replacement)
    body = json.dumps(doc, ensure_ascii=True).encode()  # lone surrogates become \udxxx escapes
    _check(body, "application/json", None)


@FUZZ
@given(code=st.integers(-(2**40), 2**40), message=st.text(max_size=200))
def test_encode_status_always_parses(code, message):
    st_ = status_pb2.Status.FromString(encode_status(code, message, json=False))
    assert st_.message == message.encode("utf-8", "replace").decode("utf-8")
    json.loads(encode_status(code, message, json=True))


@FUZZ
@given(rejected=st.integers(0, 2**40), errors=st.lists(st.text(max_size=40), max_size=15))
def test_encode_response_always_parses(rejected, errors):
    res = DecodeResult(rejected=rejected, errors=errors)
    pb = ExportTraceServiceResponse.FromString(encode_response(res, json=False))
    assert pb.partial_success.rejected_spans == rejected
    doc = json.loads(encode_response(res, json=True))
    if rejected or any(errors):
        assert int(doc["partialSuccess"].get("rejectedSpans", 0)) == rejected
