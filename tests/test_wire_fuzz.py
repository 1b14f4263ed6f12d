"""Process-level fuzzing of the OTLP receivers: random and mutated OTLP bodies over real HTTP and
gRPC to one running sidecar.

Every reply must be a valid OTLP reply — HTTP 200 with a parseable ``ExportTraceServiceResponse``,
or 4xx / 503 with a parseable ``google.rpc.Status`` (OTLP/HTTP spec, "Failures"), in the encoding of
the request; gRPC OK with a parseable response or one of the codes OTLP clients understand — never
another 5xx, never a dropped connection. Afterwards the process is alive, ``/healthz`` answers and
the worker still drains (a flush finishes).
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib

import grpc
import httpx
import pytest
import zstandard
from google.protobuf import json_format
from google.rpc import status_pb2
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from conftest import DATA, start_sidecar

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Seed bodies: real OTLP/JSON requests of the bug cases (C05, C06, C07, C09, C12)
SEEDS_JSON: list[dict] = []
for _name in ("C05", "C06", "C07", "C09", "C12"):
    _case = json.loads(next((DATA / "bugcases").glob(f"{_name}*.json")).read_text())
    SEEDS_JSON += [r["body"] for r in _case["requests"] if "body" in r]


def _to_pb(doc: dict) -> bytes:
    """OTLP/JSON (camelCase, hex ids) → protobuf bytes; ``None`` for a doc json_format rejects."""
    d = json.loads(json.dumps(doc))
    for rs in d.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if sp.get(k):
                        sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
    return json_format.ParseDict(d, ExportTraceServiceRequest()).SerializeToString()


SEEDS_PB = [_to_pb(d) for d in SEEDS_JSON if "resourceSpans" in d]

OTHER_TYPES = st.sampled_from(["text/plain", "", "application/grpc", "multipart/form-data; boundary=x",
                               "application/jsonx", "application/x-protobuf-json"])
KNOWN_ENCODINGS = st.sampled_from(["gzip", "deflate", "zstd", "identity", "x-gzip", "GZIP", "gzip, gzip",
                                   "gzip, identity"])
ENCODINGS = st.one_of(st.sampled_from(["br", "compress", ",", "gzip;q=1", "deflate, zstd"]),
                      st.text(alphabet="abcdefghijklmnopqrstuvwxyz,- ", max_size=12).map(str.strip))
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda c: st.one_of(st.lists(c, max_size=3),
                                                             st.dictionaries(st.text(max_size=8), c, max_size=3)),
                           max_leaves=8)


def _compress(body: bytes, coding: str | None) -> bytes:
    """Compress ``body`` the way ``coding`` says (when it names something we can produce)."""
    for c in reversed([x.strip().lower() for x in (coding or "").split(",")]):
        if c in ("gzip", "x-gzip"):
            body = gzip.compress(body, mtime=0)
        elif c == "deflate":
            body = zlib.compress(body)
        elif c == "zstd":
            body = zstandard.ZstdCompressor().compress(body)
    return body


def _paths(obj, prefix=()):
    """Every (container path, key/index) in a JSON tree."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix, k
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix, i
            yield from _paths(v, prefix + (i,))


def _at(obj, path):
    for p in path:
        obj = obj[p]
    return obj


@st.composite
def json_mutants(draw) -> bytes:
    """A seed OTLP/JSON body with a few keys deleted or values swapped for other JSON types."""
    doc = json.loads(json.dumps(draw(st.sampled_from(SEEDS_JSON))))
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        if not paths:
            break
        parent, key = paths[draw(st.integers(0, len(paths) - 1))]
        container = _at(doc, parent)
        if draw(st.booleans()) and isinstance(container, dict):
            del container[key]
        else:
            container[key] = draw(JSON_VALUES)
    return json.dumps(doc).encode()


@st.composite
def byte_mutants(draw, seeds: list[bytes]) -> bytes:
    """A seed body with bit flips, a truncation or a splice of random bytes."""
    body = bytearray(draw(st.sampled_from(seeds)))
    op = draw(st.sampled_from(["flip", "truncate", "splice"]))
    if op == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(body) - 1))
            body[i] ^= 1 << draw(st.integers(0, 7))
    elif op == "truncate":
        body = body[: draw(st.integers(0, len(body) - 1))]
    else:
        i = draw(st.integers(0, len(body)))
        body[i:i + draw(st.integers(0, 16))] = draw(st.binary(max_size=32))
    return bytes(body)


SEEDS_JSON_BYTES = [json.dumps(d).encode() for d in SEEDS_JSON]
JSON_BODIES = st.one_of(json_mutants(), byte_mutants(SEEDS_JSON_BYTES), st.sampled_from(SEEDS_JSON_BYTES),
                        st.sampled_from([b"", b"{}", b"[]", b"null", b'{"resourceSpans": {}}']))
PB_BODIES = st.one_of(byte_mutants(SEEDS_PB), st.sampled_from(SEEDS_PB), st.binary(max_size=512))
ANY_BODIES = st.one_of(st.binary(max_size=512), JSON_BODIES, PB_BODIES)
JSON_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8", "Application/JSON"])
PB_TYPES = st.sampled_from(["application/x-protobuf", "application/protobuf", "APPLICATION/X-PROTOBUF"])


@st.composite
def otlp_requests(draw) -> tuple[bytes, dict]:
    """(body, headers): mostly a JSON-ish body as JSON or a protobuf-ish body as protobuf, sometimes
    crossed or with a content type / content encoding the receiver does not know."""
    family = draw(st.sampled_from(["json", "json", "pb", "pb", "crossed", "other_type"]))
    if family == "json":
        body, ctype = draw(JSON_BODIES), draw(JSON_TYPES)
    elif family == "pb":
        body, ctype = draw(PB_BODIES), draw(PB_TYPES)
    elif family == "crossed":
        body, ctype = draw(ANY_BODIES), draw(st.one_of(JSON_TYPES, PB_TYPES))
    else:
        body, ctype = draw(ANY_BODIES), draw(OTHER_TYPES)
    headers = {"Content-Type": ctype} if ctype else {}
    coding = {"none": st.none(), "known": KNOWN_ENCODINGS, "unknown": ENCODINGS}[
        draw(st.sampled_from(["none"] * 4 + ["known"] * 3 + ["unknown"]))]
    coding = draw(coding)
    if coding is not None:
        headers["Content-Encoding"] = coding
        if draw(st.integers(0, 3)):  # mostly compressed as declared, sometimes a lie
            body = _compress(body, coding)
    return body, headers


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = start_sidecar(tmp_path_factory.mktemp("wirefuzz"))
    try:
        yield s
    finally:
        s.kill()
        for f in (s.proc.stdout, s.proc.stderr):
            if f:
                f.close()


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=30) as c:
        yield c


def _check_http_reply(r: httpx.Response) -> None:
    ctype = r.headers.get("content-type", "").split(";")[0]
    assert ctype in ("application/json", "application/x-protobuf"), (r.status_code, ctype, r.content[:200])
    is_json = ctype == "application/json"
    if r.status_code == 200:
        if is_json:
            json_format.Parse(r.content, ExportTraceServiceResponse())
        else:
            ExportTraceServiceResponse.FromString(r.content)
        return
    assert 400 <= r.status_code < 500 or r.status_code == 503, (r.status_code, r.content[:300])
    st_ = json_format.Parse(r.content, status_pb2.Status()) if is_json else status_pb2.Status.FromString(r.content)
    assert st_.code != 0 and st_.message, (r.status_code, st_)
    if r.status_code == 503:
        assert r.headers.get("retry-after", "").isdigit()


@FUZZ
@given(req=otlp_requests())
def test_http_replies_are_always_valid_otlp(sc, client, req):
    body, headers = req
    r = client.post(f"{sc.otlp_http}/v1/traces", content=body, headers=headers)
    event(f"HTTP {r.status_code}")
    _check_http_reply(r)
    ctype = headers.get("Content-Type", "").split(";")[0].strip().lower()
    if ctype not in ("application/json", "application/x-protobuf", "application/protobuf"):
        assert r.status_code == 415  # whatever the body and its encoding
    else:
        assert (r.headers["content-type"].split(";")[0] == "application/json") == (ctype == "application/json")


GRPC_OK_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}


@pytest.fixture(scope="module")
def grpc_call(sc):
    ch = grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}")
    try:
        yield ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    finally:
        ch.close()


@settings(FUZZ, max_examples=80)
@given(body=PB_BODIES,
       gzip_call=st.booleans())
def test_grpc_replies_are_always_valid_otlp(grpc_call, body, gzip_call):
    kw = {"compression": grpc.Compression.Gzip} if gzip_call else {}
    try:
        ExportTraceServiceResponse.FromString(grpc_call(body, timeout=30, **kw))
        event("gRPC OK")
    except grpc.RpcError as e:
        event(f"gRPC {e.code().name}")
        assert e.code() in GRPC_OK_CODES, (e.code(), e.details())
        assert e.details()


def test_sidecar_survives_the_fuzzing(sc, client):
    # runs after the fuzz tests of this module (file order): same sidecar
    assert sc.proc.poll() is None
    h = sc.get("/healthz")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    sc.flush()  # the worker is not wedged by anything it accepted
    good = json.dumps(SEEDS_JSON[0]).encode()
    r = client.post(f"{sc.otlp_http}/v1/traces", content=good, headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    # unknown path / wrong method also answer with a Status body
    for resp, code in ((client.post(f"{sc.otlp_http}/v1/nope", content=b"{}",
                                    headers={"Content-Type": "application/json"}), 404),
                       (client.get(f"{sc.otlp_http}/v1/traces", headers={"Content-Type": "application/json"}), 405)):
        assert resp.status_code == code
        _check_http_reply(resp)
