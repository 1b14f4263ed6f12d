"""Bug cases C05–C12 (shared/data/bugcases) over the wire: real HTTP / gRPC to a real sidecar.

Each case's requests are POSTed in order to ``/v1/traces``; the reply is parsed with the
opentelemetry-proto / googleapis-common-protos classes (``ExportTraceServiceResponse``,
``google.rpc.Status``); what was stored and assembled is read back from the management API
(``/api/v1/spans?trace_id=``, ``/api/v1/trials``, ``/metrics``) after ``POST /api/v1/flush``, and
for column values the API does not expose (exact timestamps, stored attribute text, flags) from the
sidecar's own ClickHouse data directory after the sidecar has stopped (a child process opens it:
chDB lets one process hold a data directory).

Most cases reuse the trace id ``5b8efff7…fc60c`` and the same span ids, so to run them against one
sidecar (starting one costs seconds) each case's copy gets its own trace id (``_case_trace``); the
ids are otherwise arbitrary and C09, whose point is the id encoding, is sent unchanged.
Expected values are worked out from the case files here, never copied from the sidecar's output.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import subprocess
import sys

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from conftest import DATA, start_sidecar

CASES = DATA / "bugcases"
ORIG_TRACE = "5b8efff798038103d269b633813fc60c"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
BAD_UTF8 = bytes.fromhex("E4BDA0E5A5")  # "你" + a truncated 3-byte sequence (C08)
MIB = 1 << 20


# ---- helpers ------------------------------------------------------------------------------------

def _case(name: str) -> dict:
    return json.loads(next(CASES.glob(f"{name}*.json")).read_text())


def _case_trace(tag: int) -> str:
    """A distinct trace id per case copy: the original with its first byte replaced."""
    t = f"{tag:02x}" + ORIG_TRACE[2:]
    assert t != ORIG_TRACE
    return t


def _retrace(obj, trace_id: str):
    """Deep copy of a JSON value with the original trace id replaced."""
    return json.loads(json.dumps(obj).replace(ORIG_TRACE, trace_id))


def _requests(name: str, trace_id: str | None) -> list[tuple[dict, bytes]]:
    """(headers, body bytes) of a case's requests, trace id rewritten when ``trace_id`` is given."""
    out = []
    for r in _case(name)["requests"]:
        if "body_file" in r:
            body = (CASES / r["body_file"]).read_bytes()
            if r["headers"].get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
                if trace_id:
                    body = body.replace(ORIG_TRACE.encode(), trace_id.encode())
                body = gzip.compress(body, mtime=0)
            elif trace_id:
                body = body.replace(ORIG_TRACE.encode(), trace_id.encode())
        elif "body" in r:
            b = _retrace(r["body"], trace_id) if trace_id else r["body"]
            body = json.dumps(b).encode()
        else:
            continue
        out.append((dict(r["headers"]), body))
    return out


def _spans_of(body: dict) -> list[dict]:
    return [sp for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]


def _attr(span: dict, key: str):
    for kv in span.get("attributes", []):
        if kv["key"] == key:
            return next(iter(kv["value"].values()))
    return None


def _post(sc, body: bytes, headers: dict, **kw) -> httpx.Response:
    return httpx.post(f"{sc.otlp_http}/v1/traces", content=body, headers=headers, timeout=60, **kw)


def _ok(r: httpx.Response, *, is_json: bool = True) -> ExportTraceServiceResponse:
    """Assert a 200 OTLP reply and return its parsed ExportTraceServiceResponse."""
    assert r.status_code == 200, (r.status_code, r.content[:500])
    ctype = r.headers["content-type"].split(";")[0]
    assert ctype == ("application/json" if is_json else "application/x-protobuf")
    if is_json:
        return json_format.Parse(r.content, ExportTraceServiceResponse())
    return ExportTraceServiceResponse.FromString(r.content)


def _status(r: httpx.Response, code: int, *, is_json: bool) -> status_pb2.Status:
    """Assert an error reply with HTTP ``code`` and a google.rpc.Status body; return it."""
    assert r.status_code == code, (r.status_code, r.content[:500])
    ctype = r.headers["content-type"].split(";")[0]
    assert ctype == ("application/json" if is_json else "application/x-protobuf")
    st = json_format.Parse(r.content, status_pb2.Status()) if is_json else status_pb2.Status.FromString(r.content)
    assert st.message
    return st


def _flush(sc, timeout_s: float = 20) -> None:
    r = sc.post("/api/v1/flush", params={"timeout_s": timeout_s})
    assert r.status_code == 200, r.text


def _keys(sc, trace_id: str) -> set[str]:
    r = sc.get("/api/v1/spans", params={"trace_id": trace_id})
    assert r.status_code == 200, r.text
    keys = r.json()["keys"]
    assert all(k[0] == trace_id for k in keys)
    span_ids = [k[1] for k in keys]
    assert len(span_ids) == len(set(span_ids)), "a span is stored more than once"
    return set(span_ids)


def _trials(sc, trace_id: str) -> list[dict]:
    return [t for t in sc.trials() if t["trace_id"] == trace_id]


def _counters(sc) -> dict[tuple[str, tuple], float]:
    text = sc.get("/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _counter(c: dict, name: str, **labels) -> float:
    return c.get((name, tuple(sorted(labels.items()))), 0.0)


def _rejected_total(c: dict) -> float:
    return sum(v for (n, _), v in c.items() if n == "relyscope_spans_rejected_total")


def _otlp_json_to_pb(json_body: bytes) -> ExportTraceServiceRequest:
    """OTLP/JSON → message. OTLP/JSON ids are hex where the proto3 JSON mapping of ``bytes``
    (json_format) expects base64, so the ids are re-encoded first."""
    doc = json.loads(json_body)
    for sp in _spans_of(doc):
        for k in ("traceId", "spanId", "parentSpanId"):
            if sp.get(k):
                sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest())


def _pb_body(json_body: bytes, *, bad_utf8_at: bytes | None = None) -> bytes:
    """The protobuf encoding of an OTLP/JSON body. With ``bad_utf8_at``, the body holds
    :data:`BAD_UTF8` there: it is parsed with a same-length ASCII placeholder and the serialized
    bytes patched (protobuf refuses to serialize invalid UTF-8 in a string field)."""
    ph = b"@@@@@"
    assert len(ph) == len(BAD_UTF8)
    if bad_utf8_at is not None:
        json_body = json_body.replace(bad_utf8_at, ph)
    raw = _otlp_json_to_pb(json_body).SerializeToString()
    if bad_utf8_at is not None:
        assert raw.count(ph) == 1
        raw = raw.replace(ph, BAD_UTF8)
    return raw


def _grpc_raw(sc, raw: bytes, **kw) -> bytes:
    with grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        return call(raw, timeout=30, **kw)


def _big_agent_run(trace_id: str, text: str) -> tuple[dict, dict]:
    """C11: (root + tool request, request with the LLM span holding ``text`` in
    gen_ai.input.messages), built from C05's first request."""
    body = _retrace(_case("C05")["requests"][0]["body"], trace_id)
    big = copy.deepcopy(body)
    spans = body["resourceSpans"][0]["scopeSpans"][0]["spans"]
    llm = spans.pop(1)
    assert llm["spanId"] == "b2b2b2b2b2b2b2b2"
    llm["attributes"].append({"key": "gen_ai.input.messages", "value": {"stringValue": text}})
    big["resourceSpans"][0]["scopeSpans"][0]["spans"] = [llm]
    return body, big


def _c11_text() -> str:
    # 6 MiB of text: a JSON message list holding a "pasted file" (ASCII, so chars == bytes)
    filler = "".join(f"line {i:07d} of the pasted file\n" for i in range(6 * MIB // 30 + 1))
    msgs = json.dumps([{"role": "user", "parts": [{"type": "text", "content": filler}]}])
    return msgs


# ---- fixtures -----------------------------------------------------------------------------------

def _stop(sc) -> None:
    sc.kill()
    for f in (sc.proc.stdout, sc.proc.stderr):
        if f:
            f.close()


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    """One sidecar (default settings) for the API-level case tests of this module."""
    s = start_sidecar(tmp_path_factory.mktemp("transport"))
    try:
        yield s
    finally:
        _stop(s)


STORE_QUERY = r"""
import json, sys, clickhouse_connect
c = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
cols = [r[0] for r in c.query("SELECT name FROM system.columns WHERE database = 'relyscope' "
                              "AND table = 'otel_traces'").result_rows]
sel = ["TraceId", "SpanId", "toString(toUnixTimestamp64Nano(Timestamp))", "toString(Duration)",
       "RelyscopeFlags", "SpanAttributes", "SpanName", "ScopeName"]
extra = [c2 for c2 in cols if c2.startswith("Relyscope") and c2 != "RelyscopeFlags"]
rows = c.query(f"SELECT {', '.join(sel + [f'toString({x})' for x in extra])} "
               "FROM relyscope.otel_traces FINAL").result_rows
out = []
for r in rows:
    d = dict(zip(["trace", "span", "ts", "dur", "flags", "attrs", "name", "scope"], r[:8]))
    d["ts"], d["dur"] = int(d["ts"]), int(d["dur"])
    d["flags"] = list(d["flags"])
    d["extra"] = dict(zip(extra, r[8:]))
    out.append(d)
sys.stdout.buffer.write(json.dumps(out, ensure_ascii=True).encode())
"""

STORED_TRACES = {"C07": _case_trace(0x07), "C08": _case_trace(0x08), "C08pb": _case_trace(0x18),
                 "C11": _case_trace(0x11)}


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict[tuple[str, str], dict]:
    """Stored ``otel_traces`` rows after sending C07, C08 (JSON and protobuf), C09 and C11 to a
    fresh sidecar, flushing and stopping it: {(trace_id, span_id): row}."""
    d = tmp_path_factory.mktemp("stored")
    s = start_sidecar(d)
    try:
        for name, tag in (("C07", "C07"), ("C08", "C08")):
            for headers, body in _requests(name, STORED_TRACES[tag])[:1]:
                _ok(_post(s, body, headers))
        json_bin = _requests("C08", STORED_TRACES["C08pb"])[0][1]
        _ok(_post(s, _pb_body(json_bin, bad_utf8_at=BAD_UTF8), {"Content-Type": "application/x-protobuf"}),
            is_json=False)
        for headers, body in _requests("C09", None):
            _ok(_post(s, body, headers))
        root_tool, big = _big_agent_run(STORED_TRACES["C11"], _c11_text())
        for b in (root_tool, big):
            _ok(_post(s, json.dumps(b).encode(), {"Content-Type": "application/json"}))
        _flush(s)
    finally:
        _stop(s)
    r = subprocess.run([sys.executable, "-c", STORE_QUERY, str(d / "data")], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return {(x["trace"], x["span"]): x for x in json.loads(r.stdout)}


# ---- C05 ----------------------------------------------------------------------------------------

def test_c05_retry_duplicates_make_one_trajectory_with_totals_not_doubled(sc):
    tid = _case_trace(0x05)
    reqs = _requests("C05", tid)
    assert len(reqs) == 2 and reqs[0][1] == reqs[1][1]  # an identical retry
    for headers, body in reqs:
        resp = _ok(_post(sc, body, headers))
        assert not resp.HasField("partial_success")
    # expected totals: token attributes of the DISTINCT (traceId, spanId) spans of the file
    distinct: dict[tuple[str, str], dict] = {}
    naive_in = 0
    for r in _case("C05")["requests"]:
        for sp in _spans_of(r["body"]):
            distinct[(sp["traceId"], sp["spanId"])] = sp
            naive_in += int(_attr(sp, "gen_ai.usage.input_tokens") or 0)
    exp_in = sum(int(_attr(sp, "gen_ai.usage.input_tokens") or 0) for sp in distinct.values())
    exp_out = sum(int(_attr(sp, "gen_ai.usage.output_tokens") or 0) for sp in distinct.values())
    assert naive_in == 2 * exp_in  # the retry really would double a naive sum
    _flush(sc)
    assert _keys(sc, tid) == {sid for _, sid in distinct}
    trials = _trials(sc, tid)
    assert len(trials) == 1
    t = trials[0]
    assert t["span_count"] == len(distinct) == 3
    assert t["root_span_id"] == "a1a1a1a1a1a1a1a1"
    assert t["actions"] == ["llm", "get_order_details"]  # root + 2 steps: nothing repeated
    assert (t["input_tokens"], t["output_tokens"]) == (exp_in, exp_out) == (812, 41)
    assert t["total_tokens"] == exp_in + exp_out
    assert t["model_calls"] == 1 and t["tool_calls"] == 1


# ---- C06 ----------------------------------------------------------------------------------------

def test_c06_duplicate_span_id_in_batch_keeps_one_copy_and_the_batch(sc):
    tid = _case_trace(0x06)
    before = _counters(sc)
    [(headers, body)] = _requests("C06", tid)
    spans = _spans_of(json.loads(body))
    dup = [sp for sp in spans if sp["spanId"] == "c3c3c3c3c3c3c3c3"]
    assert len(dup) == 2
    resp = _ok(_post(sc, body, headers))
    assert resp.partial_success.rejected_spans == 0  # nothing of the batch is lost
    _flush(sc)
    assert _keys(sc, tid) == {sp["spanId"] for sp in spans} == {"a1a1a1a1a1a1a1a1", "c3c3c3c3c3c3c3c3"}
    [t] = _trials(sc, tid)
    [step] = [s for s in t["steps"] if s["span_id"] == "c3c3c3c3c3c3c3c3"]
    last = dup[-1]  # the kept copy is the last (here also the more complete) one
    assert step["end_ns"] == int(last["endTimeUnixNano"]) != int(dup[0]["endTimeUnixNano"])
    assert step["result"] == json.loads(_attr(last, "gen_ai.tool.call.result"))
    after = _counters(sc)
    name = "relyscope_otlp_warnings_total"
    assert _counter(after, name, kind="duplicate_in_batch") - _counter(before, name, kind="duplicate_in_batch") == 1


# ---- C07 ----------------------------------------------------------------------------------------

def test_c07_end_before_start_is_stored_clamped_and_flagged(sc):
    tid = _case_trace(0x07)
    before = _counters(sc)
    [(headers, body)] = _requests("C07", tid)
    spans = {sp["spanId"]: sp for sp in _spans_of(json.loads(body))}
    _ok(_post(sc, body, headers))
    _flush(sc)
    assert _keys(sc, tid) == set(spans)
    [t] = _trials(sc, tid)
    root = spans["a1a1a1a1a1a1a1a1"]
    assert t["wall_time_s"] == (int(root["endTimeUnixNano"]) - int(root["startTimeUnixNano"])) / 1e9 == 9.0
    steps = {s["span_id"]: s for s in t["steps"]}
    llm, tool = steps["b2b2b2b2b2b2b2b2"], steps["c3c3c3c3c3c3c3c3"]
    # never negative / unsigned-wrapped: clamped to the start
    assert llm["start_ns"] == llm["end_ns"] == int(spans["b2b2b2b2b2b2b2b2"]["startTimeUnixNano"])
    assert tool["start_ns"] == tool["end_ns"] == int(spans["c3c3c3c3c3c3c3c3"]["startTimeUnixNano"])
    assert "end_before_start" in llm["flags"]
    assert "unended" in tool["flags"]  # end = 0 means "never ended", not clock skew
    after = _counters(sc)
    name = "relyscope_otlp_warnings_total"
    for kind, n in (("end_before_start", 2), ("missing_end", 1)):
        assert _counter(after, name, kind=kind) - _counter(before, name, kind=kind) == n, kind


def test_c07_stored_rows_have_zero_duration_and_flags(stored):
    tid = STORED_TRACES["C07"]
    body = json.loads(_requests("C07", tid)[0][1])
    for sp in _spans_of(body):
        row = stored[(tid, sp["spanId"])]
        start, end = int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])
        assert row["ts"] == start
        assert row["dur"] == max(0, end - start)  # 0 for both bad spans, never 2**64 - 2e9
        assert ("end_before_start" in row["flags"]) == (end < start)
    assert "missing_end" in stored[(tid, "c3c3c3c3c3c3c3c3")]["flags"]


def test_c07_raw_end_timestamp_is_retained_in_store(stored):
    tid = STORED_TRACES["C07"]
    body = json.loads(_requests("C07", tid)[0][1])
    for sid in ("b2b2b2b2b2b2b2b2", "c3c3c3c3c3c3c3c3"):
        sp = next(s for s in _spans_of(body) if s["spanId"] == sid)
        row = stored[(tid, sid)]
        assert row["extra"].get("RelyscopeRawEndNs") == sp["endTimeUnixNano"], row


# ---- C08 ----------------------------------------------------------------------------------------

FFFD_ARGS = {"note": BAD_UTF8.decode("utf-8", "replace")}  # "你\ufffd": the codec's replacement


def _check_c08_trial(sc, tid: str) -> None:
    assert _keys(sc, tid) == {"a1a1a1a1a1a1a1a1", "c3c3c3c3c3c3c3c3"}
    [t] = _trials(sc, tid)
    [tool] = [s for s in t["steps"] if s["span_id"] == "c3c3c3c3c3c3c3c3"]
    assert tool["arguments"] == FFFD_ARGS


def test_c08_invalid_utf8_json_body_is_replaced_and_batch_kept(sc):
    tid = _case_trace(0x08)
    before = _counters(sc)
    headers, body = _requests("C08", tid)[0]
    assert BAD_UTF8 in body
    with pytest.raises(UnicodeDecodeError):
        body.decode("utf-8")
    resp = _ok(_post(sc, body, headers))
    assert resp.partial_success.rejected_spans == 0
    _flush(sc)
    _check_c08_trial(sc, tid)
    name = "relyscope_otlp_warnings_total"
    assert _counter(_counters(sc), name, kind="invalid_utf8") - _counter(before, name, kind="invalid_utf8") == 1


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_c08_invalid_utf8_in_protobuf_string_value(sc, transport):
    tid = _case_trace(0x18 if transport == "http" else 0x28)
    raw = _pb_body(_requests("C08", tid)[0][1], bad_utf8_at=BAD_UTF8)
    with pytest.raises(Exception):  # the strict parser refuses it: this is the C08 trap
        ExportTraceServiceRequest.FromString(raw)
    if transport == "http":
        resp = _ok(_post(sc, raw, {"Content-Type": "application/x-protobuf"}), is_json=False)
    else:
        resp = ExportTraceServiceResponse.FromString(_grpc_raw(sc, raw))
    assert resp.partial_success.rejected_spans == 0
    _flush(sc)
    _check_c08_trial(sc, tid)


def _surrogate_request(tid: str, *, body_escape: bool) -> bytes:
    """C08 request 2 made a real request: C05's first request whose tool span carries the case's
    ``example_attribute`` (tool arguments holding the JSON text ``{"q":"\\ud800"}``); with
    ``body_escape`` also a ``\\ud800`` escape in the OTLP/JSON body itself (an attribute value)."""
    example = _case("C08")["requests"][1]["body"]["example_attribute"]
    body = _retrace(_case("C05")["requests"][0]["body"], tid)
    tool = _spans_of(body)[2]
    tool["attributes"] = [kv for kv in tool["attributes"] if kv["key"] != example["key"]]
    if not body_escape:
        tool["attributes"].append(example)
    text = json.dumps(body)
    if body_escape:
        text = text.replace('"support_bot"}', '"support_bot\\ud800"}', 1)
        assert "\\ud800" in text
    return text.encode()


def _check_surrogate_case(s, tid: str, tid2: str, body: bytes, flush_s: float = 20) -> None:
    resp = _ok(_post(s, body, {"Content-Type": "application/json"}))
    assert resp.partial_success.rejected_spans == 0
    _flush(s, flush_s)
    assert _keys(s, tid) == {"a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2", "c3c3c3c3c3c3c3c3"}
    trials = _trials(s, tid)
    assert len(trials) == 1 and trials[0]["actions"] == ["llm", "get_order_details"]
    # nothing downstream is wedged: a later clean batch is still stored and assembled
    _ok(_post(s, _requests("C05", tid2)[0][1], {"Content-Type": "application/json"}))
    _flush(s)
    assert len(_trials(s, tid2)) == 1


def test_c08_lone_surrogate_escape_in_body_is_replaced(sc):
    """C08 request 2, at the OTLP/JSON level: ``\\ud800`` parses in Python but cannot be
    re-encoded to UTF-8; the decoder must replace it and keep the batch."""
    tid = _case_trace(0x48)
    _check_surrogate_case(sc, tid, _case_trace(0x68), _surrogate_request(tid, body_escape=True))
    [t] = _trials(sc, tid)
    assert t["agent_name"] == "support_bot\ufffd"


def test_c08_lone_surrogate_inside_tool_arguments_does_not_wedge_writer(sidecar):
    """C08 request 2 as the case file carries it: the escape is inside the tool-arguments JSON
    text, decoded once more by normalization. Own sidecar: when this fails it wedges the writer."""
    tid = _case_trace(0x38)
    _check_surrogate_case(sidecar, tid, _case_trace(0x58), _surrogate_request(tid, body_escape=False),
                          flush_s=8)
    [t] = _trials(sidecar, tid)
    [tool] = [x for x in t["steps"] if x["span_id"] == "c3c3c3c3c3c3c3c3"]
    # repaired, not dropped (the store writes 3 U+FFFD for one surrogate, the decoder 1: report)
    assert set(tool["arguments"]) == {"q"} and set(tool["arguments"]["q"]) == {"\ufffd"}


def test_c08_stored_attribute_has_replacement_character(stored):
    for tag in ("C08", "C08pb"):
        tid = STORED_TRACES[tag]
        row = stored[(tid, "c3c3c3c3c3c3c3c3")]
        assert json.loads(row["attrs"]["gen_ai.tool.call.arguments"]) == FFFD_ARGS
        assert "invalid_utf8" in row["flags"]
        assert "invalid_utf8" not in stored[(tid, "a1a1a1a1a1a1a1a1")]["flags"]


# ---- C09 ----------------------------------------------------------------------------------------

def _c09_expected() -> list[tuple[str, str, int, int]]:
    """(trace hex, span hex, start ns, end ns) worked out from the case file: base64 → bytes →
    lowercase hex, uppercase hex → lowercase; int64 numbers parsed as Python ints (no float)."""
    out = []
    for r in _case("C09")["requests"]:
        b = r["body"]
        rss = b.get("resourceSpans") or b["resource_spans"]
        for rs in rss:
            for ss in rs.get("scopeSpans") or rs["scope_spans"]:
                for sp in ss["spans"]:
                    t = sp.get("traceId") or sp["trace_id"]
                    s = sp.get("spanId") or sp["span_id"]
                    if len(t) == 32:
                        t, s = bytes.fromhex(t).hex(), bytes.fromhex(s).hex()
                    else:
                        t, s = base64.b64decode(t).hex(), base64.b64decode(s).hex()
                    st = sp.get("startTimeUnixNano", sp.get("start_time_unix_nano"))
                    en = sp.get("endTimeUnixNano", sp.get("end_time_unix_nano"))
                    out.append((t, s, int(st), int(en)))
    return out


def test_c09_base64_snake_case_uppercase_and_big_numbers_are_accepted(sc):
    exp = _c09_expected()
    assert exp[0][:2] == ("67acfc2ea56f108fa4535fc28ba99705", "80c1200c94be1178")
    assert exp[1][:2] == (ORIG_TRACE, "eee19b7ec3c1b174")
    assert float(exp[0][3]) != exp[0][3]  # > 2**53: a float parse would round it
    for headers, body in _requests("C09", None):
        resp = _ok(_post(sc, body, headers))
        assert resp.partial_success.rejected_spans == 0
    _flush(sc)
    for t, s, _, _ in exp:
        assert s in _keys(sc, t)


def test_c09_stored_with_lowercase_ids_and_exact_timestamps(stored):
    for t, s, start, end in _c09_expected():
        row = stored[(t, s)]
        assert (row["ts"], row["dur"]) == (start, end - start)
    assert stored[("67acfc2ea56f108fa4535fc28ba99705", "80c1200c94be1178")]["dur"] == 11750


# ---- C10 ----------------------------------------------------------------------------------------

def test_c10_gzip_json_and_gzip_protobuf_are_inflated(sc):
    case = _case("C10")
    assert [r["headers"].get("Content-Encoding") for r in case["requests"]] == ["gzip", "gzip"]
    tj, tp = _case_trace(0x10), _case_trace(0x20)
    [(headers, gz)] = _requests("C10", tj)
    plain = gzip.decompress(gz)
    exp = {sp["spanId"] for sp in _spans_of(json.loads(plain))}
    resp = _ok(_post(sc, gz, headers))
    assert resp.partial_success.rejected_spans == 0
    pb = _pb_body(plain.replace(tj.encode(), tp.encode()))
    resp = _ok(_post(sc, gzip.compress(pb), {"Content-Type": "application/x-protobuf",
                                              "Content-Encoding": "gzip"}), is_json=False)
    assert resp.partial_success.rejected_spans == 0
    _flush(sc)
    assert _keys(sc, tj) == exp == {"a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2"}
    assert _keys(sc, tp) == exp
    assert len(_trials(sc, tj)) == 1 and len(_trials(sc, tp)) == 1


@pytest.mark.parametrize("ctype", ["application/json", "application/x-protobuf"])
def test_c10_bad_gzip_is_400_with_status_never_500(sc, ctype):
    gz = (CASES / "C10_gzip.body.bin").read_bytes()
    for bad in (gz[: len(gz) // 2],  # truncated stream
                gz[:10] + bytes(b ^ 0x5A for b in gz[10:]),  # corrupt deflate data
                b"\x1f\x8b\x08\x04garbage",  # header flags with nothing behind
                b"{not gzip at all}"):
        r = _post(sc, bad, {"Content-Type": ctype, "Content-Encoding": "gzip"})
        st = _status(r, 400, is_json=ctype == "application/json")
        assert st.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "gzip" in st.message


def test_unsupported_content_type_is_415_with_status(sc):
    for headers in ({"Content-Type": "text/plain"}, {}):
        r = _post(sc, b"hello", headers)
        st = _status(r, 415, is_json=False)
        assert "Content-Type" in st.message
    r = _post(sc, b"{}", {"Content-Type": "application/json", "Content-Encoding": "br"})
    assert "Content-Encoding" in _status(r, 415, is_json=True).message


# ---- C11 ----------------------------------------------------------------------------------------

def test_c11_six_mib_attribute_accepted_with_default_limit(sc):
    tid = _case_trace(0x11)
    text = _c11_text()
    assert len(text.encode()) >= 6 * MIB
    root_tool, big = _big_agent_run(tid, text)
    for b in (root_tool, big):
        resp = _ok(_post(sc, json.dumps(b).encode(), {"Content-Type": "application/json"}))
        assert resp.partial_success.rejected_spans == 0
    _flush(sc)
    assert _keys(sc, tid) == {"a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2", "c3c3c3c3c3c3c3c3"}
    [t] = _trials(sc, tid)
    assert t["actions"] == ["llm", "get_order_details"] and t["input_tokens"] == 812


def test_c11_stored_attribute_is_intact(stored):
    row = stored[(STORED_TRACES["C11"], "b2b2b2b2b2b2b2b2")]
    assert row["attrs"]["gen_ai.input.messages"] == _c11_text()
    assert "truncated_attribute" not in row["flags"]


def test_c11_body_over_configured_limit_is_413_and_sidecar_keeps_serving(tmp_path):
    limit = 4 * MIB
    s = start_sidecar(tmp_path, extra_env={"RELYSCOPE_MAX_BODY_BYTES": str(limit)})
    try:
        tid = _case_trace(0x11)
        root_tool, big = _big_agent_run(tid, _c11_text())
        big_body = json.dumps(big).encode()
        assert len(big_body) > limit
        jh = {"Content-Type": "application/json"}
        _ok(_post(s, json.dumps(root_tool).encode(), jh))
        st = _status(_post(s, big_body, jh), 413, is_json=True)  # Content-Length over the limit
        assert str(limit) in st.message
        # chunked upload (no Content-Length): the limit is enforced while reading
        chunks = (big_body[i:i + MIB] for i in range(0, len(big_body), MIB))
        st = _status(_post(s, chunks, jh), 413, is_json=True)
        assert str(limit) in st.message
        # small gzip body that inflates past the limit
        gz = gzip.compress(big_body)
        assert len(gz) < limit
        st = _status(_post(s, gz, {**jh, "Content-Encoding": "gzip"}), 413, is_json=True)
        assert str(limit) in st.message
        # protobuf over gRPC: the server's receive limit
        pb = _pb_body(big_body)
        with pytest.raises(grpc.RpcError) as ei:
            _grpc_raw(s, pb)
        # permanent (issue 10): RESOURCE_EXHAUSTED made exporters retry a request that can never fit
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and str(limit) in ei.value.details()
        # still serving: health, a normal request, and the rest of the trajectory survived
        assert s.proc.poll() is None
        assert s.get("/healthz").status_code == 200
        small = _retrace(_case("C05")["requests"][0]["body"], _case_trace(0x21))
        _ok(_post(s, json.dumps(small).encode(), jh))
        _flush(s)
        [t] = [x for x in s.trials() if x["trace_id"] == tid]
        assert t["root_span_id"] == "a1a1a1a1a1a1a1a1" and t["actions"] == ["get_order_details"]
        assert len([x for x in s.trials() if x["trace_id"] == _case_trace(0x21)]) == 1
        assert _keys(s, tid) == {"a1a1a1a1a1a1a1a1", "c3c3c3c3c3c3c3c3"}
    finally:
        _stop(s)


# ---- C12 ----------------------------------------------------------------------------------------

def test_c12_partial_success_names_the_rejected_span(sc):
    tid = _case_trace(0x12)
    [(headers, body)] = _requests("C12", tid)
    spans = _spans_of(json.loads(body))
    valid = {sp["spanId"] for sp in spans if sp.get("spanId")}
    assert len(spans) - len(valid) == 1
    before = _rejected_total(_counters(sc))
    resp = _ok(_post(sc, body, headers))
    raw = json.loads(_post(sc, body, headers).content)  # the camelCase OTLP/JSON shape itself
    assert int(raw["partialSuccess"]["rejectedSpans"]) == 1
    assert resp.partial_success.rejected_spans == 1
    assert "spanId" in resp.partial_success.error_message
    _flush(sc)
    assert _keys(sc, tid) == valid
    assert _rejected_total(_counters(sc)) - before == 2  # sent twice
    [t] = _trials(sc, tid)
    assert t["actions"] == ["llm"]


def test_c12_partial_success_over_grpc(sc):
    tid = _case_trace(0x22)
    [(_, body)] = _requests("C12", tid)
    req = _otlp_json_to_pb(body)
    with grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        resp = trace_service_pb2_grpc.TraceServiceStub(ch).Export(req, timeout=30)
    assert resp.partial_success.rejected_spans == 1
    assert "spanId" in resp.partial_success.error_message
    _flush(sc)
    assert _keys(sc, tid) == {"a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2"}


def test_grpc_undecodable_bytes_are_invalid_argument(sc):
    valid = _pb_body(_requests("C05", _case_trace(0x23))[0][1])
    for raw in (b"\xff\xff\xff\xff\xff", valid[:-7], b"\x0a\xff\xff\xff\xff\x0f"):
        with pytest.raises(grpc.RpcError) as ei:
            _grpc_raw(sc, raw)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raw
    # gzip-compressed gRPC message (grpc-encoding) is accepted
    resp = ExportTraceServiceResponse.FromString(_grpc_raw(sc, valid, compression=grpc.Compression.Gzip))
    assert not resp.HasField("partial_success")
    _flush(sc)
    assert len(_keys(sc, _case_trace(0x23))) == 3
    assert sc.proc.poll() is None and sc.get("/healthz").status_code == 200
