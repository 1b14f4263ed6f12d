"""Bug cases D03–D21 (shared/data/bugcases) and the classes of issue 11 over the wire: real HTTP /
gRPC to real sidecar processes (``relyscope.testing``), asserting the reply, what is stored and
what is scored.

Cases that need no special settings share one module sidecar (``sc``); each case's trace ids are
its own, so they do not interfere. Expected values are worked out by hand from the case files (the
comment beside each number says how), never copied from the sidecar's output.
"""

from __future__ import annotations

import json

import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client.parser import text_string_to_metric_families

from conftest import DATA, start_sidecar

CASES = DATA / "bugcases"
JSON_H = {"Content-Type": "application/json"}


# ---- helpers ------------------------------------------------------------------------------------

def _case(name: str) -> dict:
    return json.loads(next(CASES.glob(f"{name}_*.json")).read_text())


def _spans_of(body: dict) -> list[dict]:
    return [sp for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]


def _attr(span: dict, key: str):
    for kv in span.get("attributes", []):
        if kv["key"] == key:
            return next(iter(kv["value"].values()))
    return None


def _post(sc, body, headers=JSON_H, path="/v1/traces") -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{sc.otlp_http}{path}", content=data, headers=headers, timeout=60)


def _ok(r: httpx.Response) -> ExportTraceServiceResponse:
    assert r.status_code == 200, (r.status_code, r.content[:500])
    return json_format.Parse(r.content, ExportTraceServiceResponse())


def _send_case(sc, name: str) -> list[ExportTraceServiceResponse]:
    return [_ok(_post(sc, r["body"], r["headers"])) for r in _case(name)["requests"]]


def _flush(sc, timeout_s: float = 60) -> None:
    r = sc.post("/api/v1/flush", params={"timeout_s": timeout_s})
    assert r.status_code == 200, r.text


def _trials_of(sc, trace_ids) -> list[dict]:
    tids = set(trace_ids)
    return sorted((t for t in sc.trials() if t["trace_id"] in tids), key=lambda t: t["start_ns"])


def _counters(sc) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(sc.get("/metrics").text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(c: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in c.items() if n == name and want <= set(ls))


def _group(sc, agent: str, run_kind: str = "production") -> dict:
    groups = [g for g in sc.report()["groups"] if g["agent"] == agent and g["run_kind"] == run_kind]
    assert len(groups) == 1, sc.report()["groups"]
    return groups[0]


def _stop(sc) -> None:
    sc.kill()


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    """One sidecar with default settings for every case that needs none."""
    s = start_sidecar(tmp_path_factory.mktemp("traffic"))
    try:
        yield s
    finally:
        _stop(s)


# ---- D18: a batch spanning > 100 days ----------------------------------------------------------

def test_d18_batch_spanning_120_days_is_stored_and_scored(sc):
    case = _case("D18")
    [req] = case["requests"]
    spans = _spans_of(req["body"])
    days = {int(sp["startTimeUnixNano"]) // (86400 * 10**9) for sp in spans}
    assert len(spans) == 240 and len(days) > 100  # the case really spans more than 100 UTC days
    trace_ids = {sp["traceId"] for sp in spans}
    roots = [sp for sp in spans if not sp.get("parentSpanId")]
    tasks = {_attr(sp, "relyscope.task.id") for sp in roots}
    agent = _attr(roots[0], "gen_ai.agent.name")
    assert len(trace_ids) == len(roots) == 120 and len(tasks) == 10

    before = _counters(sc)
    [resp] = _send_case(sc, "D18")
    assert resp.partial_success.rejected_spans == 0
    _flush(sc)
    stored = sc.get("/api/v1/spans", params={"keys": True}).json()["keys"]
    assert len({tuple(k) for k in stored if k[0] in trace_ids}) == 240
    trials = _trials_of(sc, trace_ids)
    assert len(trials) == 120
    assert {t["task_id"] for t in trials} == tasks
    assert {t["run_kind"] for t in trials} == {"offline"}
    g = _group(sc, agent, "offline")
    assert (g["tasks"], g["trials"]) == (10, 120)
    after = _counters(sc)
    assert _sum(after, "relyscope_spans_rejected_total") == _sum(before, "relyscope_spans_rejected_total")
    health = sc.get("/healthz").json()
    assert health["status"] == "ok" and not health["last_error"], health
    quarantine = sc.data_dir / "spool.quarantine"
    assert not quarantine.exists() or not any(quarantine.iterdir())


# ---- helpers for protobuf / gRPC and for reading the store of a stopped sidecar ----------------

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _pb(body: dict) -> bytes:
    """OTLP/JSON → protobuf bytes (OTLP/JSON ids are hex where json_format expects base64)."""
    import base64

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    doc = json.loads(json.dumps(body))
    for sp in _spans_of(doc):
        for k in ("traceId", "spanId", "parentSpanId"):
            if sp.get(k):
                sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
        for ln in sp.get("links", []):
            for k in ("traceId", "spanId"):
                ln[k] = base64.b64encode(bytes.fromhex(ln[k])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest()).SerializeToString()


def _grpc(sc, raw: bytes) -> ExportTraceServiceResponse:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        return ExportTraceServiceResponse.FromString(call(raw, timeout=30))


def _retrace(body: dict, old: str, new: str) -> dict:
    return json.loads(json.dumps(body).replace(old, new))


STORE_QUERY = r"""
import json, sys, clickhouse_connect
c = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
rows = c.query("SELECT TraceId, SpanId, RelyscopeFlags, SpanAttributes FROM relyscope.otel_traces FINAL").result_rows
out = [{"trace": r[0], "span": r[1], "flags": list(r[2]), "attrs": dict(r[3])} for r in rows]
sys.stdout.buffer.write(json.dumps(out, ensure_ascii=True).encode())
"""


def _stored_rows(data_dir) -> dict[tuple[str, str], dict]:
    """``otel_traces`` rows of a stopped sidecar's store: {(trace_id, span_id): row}."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", STORE_QUERY, str(data_dir / "data")],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return {(x["trace"], x["span"]): x for x in json.loads(r.stdout)}


# ---- unreadable attribute shapes: reported in partial success and counted ------------------------

def _span(tid: str, sid: str, attributes, **kw) -> dict:
    return {"traceId": tid, "spanId": sid, "name": kw.pop("name", "chat gpt-4o"), "kind": 3,
            "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000",
            "attributes": attributes, **kw}


def _body(*spans: dict, service: str = "shape-test") -> dict:
    return {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": list(spans)}]}]}


def test_attributes_in_unreadable_shape_are_reported_and_counted(sc):
    tid = "a1" * 16
    good = _span(tid, "a1" * 8, [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}])
    # a JSON object where OTLP has a list of {key, value}: the attributes cannot be read
    as_object = _span(tid, "a2" * 8, {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 5})
    # one entry of the list is not an object; the rest are read
    bad_entry = _span(tid, "a3" * 8, [["gen_ai.operation.name", "chat"],
                                      {"key": "gen_ai.request.model", "value": {"stringValue": "m"}}])
    before = _counters(sc)
    resp = _ok(_post(sc, _body(good, as_object, bad_entry)))
    # nothing rejected (the spans are kept), but the client is told what was dropped: 2 spans
    assert resp.partial_success.rejected_spans == 0
    msg = resp.partial_success.error_message
    assert "2 spans invalid_attribute" in msg and "dropped" in msg, msg
    _flush(sc)
    keys = {tuple(k) for k in sc.get("/api/v1/spans", params={"trace_id": tid}).json()["keys"]}
    assert keys == {(tid, "a1" * 8), (tid, "a2" * 8), (tid, "a3" * 8)}
    after = _counters(sc)
    name = "relyscope_otlp_warnings_total"
    assert _sum(after, name, kind="invalid_attribute") - _sum(before, name, kind="invalid_attribute") == 2


def test_clean_request_gets_no_partial_success(sc):
    tid = "a4" * 16
    resp = _ok(_post(sc, _body(_span(tid, "a4" * 8, [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]))))
    assert not resp.HasField("partial_success")


@pytest.mark.parametrize("doc,signal", [
    ({"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": {"stringValue": "hi"}}]}]}]}, "logs"),
    ({"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "x"}]}]}]}, "metrics"),
])
def test_other_signal_posted_to_v1_traces_is_a_clear_400(sc, doc, signal):
    r = _post(sc, doc)
    assert r.status_code == 400, (r.status_code, r.text)
    st = json_format.Parse(r.content, status_pb2.Status())
    assert st.code == 3  # INVALID_ARGUMENT
    assert f"OTLP {signal} request" in st.message and f"/v1/{signal}" in st.message


def test_json_without_spans_is_400_but_empty_request_is_200(sc):
    r = _post(sc, {"foo": []})
    assert r.status_code == 400 and "no resourceSpans" in r.text
    assert not _ok(_post(sc, {})).HasField("partial_success")
    assert not _ok(_post(sc, {"resourceSpans": []})).HasField("partial_success")


def test_metrics_protobuf_posted_to_traces_is_a_clear_400(sc):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    m = ExportMetricsServiceRequest()
    metrics = m.resource_metrics.add().scope_metrics.add().metrics
    metrics.add(name="http.server.requests", unit="1").sum.data_points.add(as_int=3)
    metrics.add(name="process.memory", unit="By").gauge.data_points.add(as_double=1.5)
    r = _post(sc, m.SerializeToString(), {"Content-Type": "application/x-protobuf"})
    assert r.status_code == 400, r.content
    st = status_pb2.Status.FromString(r.content)
    assert "not an OTLP traces request" in st.message or "cannot decode protobuf" in st.message


# ---- D20 / D14: attribute limits never erase what scoring reads -------------------------------------

D20_TRACE = "2001abababababababababababababab"


def test_d20_count_limit_keeps_scoring_attributes_over_grpc_protobuf(sc):
    """The D20 spans over gRPC (protobuf path) to a default sidecar (limit 128)."""
    body = _retrace(_case("D20")["requests"][0]["body"], D20_TRACE, "20aa" + D20_TRACE[4:])
    tid = "20aa" + D20_TRACE[4:]
    resp = _grpc(sc, _pb(body))
    # root: 135 distinct keys, 5 read by scoring -> 128 kept, 7 dropped; LLM span: 146 keys, 6 read
    # by scoring, 140 flattened history -> 128 kept, 18 dropped: 25 attributes on 2 spans
    assert resp.partial_success.rejected_spans == 0
    assert "2 spans dropped_attributes" in resp.partial_success.error_message
    assert "25 attributes" in resp.partial_success.error_message
    _flush(sc)
    [t] = _trials_of(sc, [tid])
    assert (t["task_id"], t["outcome"], t["conversation_id"]) == ("attr-limit-20", "success", "sess-20")
    assert (t["model_calls"], t["input_tokens"], t["output_tokens"]) == (1, 6000, 250)


@pytest.fixture(scope="module")
def limits_run(tmp_path_factory) -> dict:
    """D14 and D20 sent to a sidecar with the D14 settings (RELYSCOPE_MAX_ATTRIBUTE_LENGTH=12);
    replies, trials and report read over the API, then the sidecar is stopped and its store read."""
    d = tmp_path_factory.mktemp("limits")
    env = _case("D14")["sidecar"]["env"]
    assert env == {"RELYSCOPE_MAX_ATTRIBUTE_LENGTH": "12"}
    s = start_sidecar(d, extra_env=env)
    try:
        out = {"d14": _send_case(s, "D14"), "d20": _send_case(s, "D20"), "before": None}
        _flush(s)
        out["trials"] = s.trials()
        out["report"] = s.report()
        out["counters"] = _counters(s)
    finally:
        _stop(s)
    out["rows"] = _stored_rows(d)
    return out


def test_d20_scoring_attributes_survive_the_count_limit(limits_run):
    [resp] = limits_run["d20"]
    assert resp.partial_success.rejected_spans == 0
    msg = resp.partial_success.error_message
    assert "2 spans dropped_attributes" in msg and "25 attributes" in msg, msg
    [t] = [t for t in limits_run["trials"] if t["trace_id"] == D20_TRACE]
    assert (t["task_id"], t["task_id_source"]) == ("attr-limit-20", "attribute")
    assert (t["outcome"], t["conversation_id"]) == ("success", "sess-20")
    assert (t["model_calls"], t["input_tokens"], t["output_tokens"]) == (1, 6000, 250)
    rows = limits_run["rows"]
    root, llm = rows[(D20_TRACE, "2001cdcdcdcdcdcd")], rows[(D20_TRACE, "2002cdcdcdcdcdcd")]
    for row in (root, llm):
        assert len(row["attrs"]) == 128 and "dropped_attributes" in row["flags"]
    for k in ("openinference.span.kind", "session.id", "relyscope.task.id", "relyscope.outcome"):
        assert k in root["attrs"]
    assert [k for k in root["attrs"] if k.startswith("metadata.tag_")].__len__() == 123
    for k in ("llm.model_name", "llm.token_count.prompt", "llm.token_count.completion",
              "llm.token_count.total", "session.id"):
        assert k in llm["attrs"]
    hist = [k for k in llm["attrs"] if k.startswith("llm.input_messages.")]
    assert len(hist) == 122 and "llm.input_messages.0.message.content" in hist  # the tail goes first


def test_d14_identity_attributes_are_never_truncated(limits_run):
    body = _case("D14")["requests"][0]["body"]
    spans = _spans_of(body)
    trace_ids = {sp["traceId"] for sp in spans}
    trials = [t for t in limits_run["trials"] if t["trace_id"] in trace_ids]
    assert sorted(t["task_id"] for t in trials) == ["customer-refund-0001", "customer-refund-0002"]
    assert sorted(t["conversation_id"] for t in trials) == ["conversation-2026-01", "conversation-2026-02"]
    for t in trials:
        assert t["actions"] == ["llm", "lookup"]
        assert "missing_tool_span" not in t["flags"]
        [tool] = [s for s in t["steps"] if s["action"] == "lookup"]
        assert tool["tool_call_id"] in ("call_abcdefghijklmnopqrst1", "call_abcdefghijklmnopqrst2")
    [g] = [g for g in limits_run["report"]["groups"] if g["agent"] == "support"]
    assert (g["tasks"], g["trials"]) == (2, 2)
    rows = limits_run["rows"]
    for sp in spans:
        row = rows[(sp["traceId"], sp["spanId"])]
        for kv in sp["attributes"]:
            sent = next(iter(kv["value"].values()))
            if not isinstance(sent, str):
                continue
            got = row["attrs"][kv["key"]]
            if kv["key"] in ("relyscope.task.id", "gen_ai.conversation.id", "gen_ai.tool.call.id",
                             "gen_ai.agent.name", "gen_ai.operation.name"):
                assert got == sent  # identity: whole, even when longer than 12
            else:
                # content: the first 12 code points (not bytes), valid UTF-8
                assert got == sent[:12] and len(got) <= 12
                got.encode("utf-8")
        if any(len(next(iter(kv["value"].values()))) > 12 for kv in sp["attributes"]
               if isinstance(next(iter(kv["value"].values())), str)
               and kv["key"] not in ("relyscope.task.id", "gen_ai.conversation.id",
                                     "gen_ai.tool.call.id")):
            assert "truncated_attribute" in row["flags"]
    # the reply names the truncation
    [resp] = limits_run["d14"]
    assert "truncated_attribute" in resp.partial_success.error_message
    assert resp.partial_success.rejected_spans == 0


# ---- D06, ghost groups: runs tied together the way their frameworks tie them ------------------

def test_d06_two_sibling_agent_runs_in_one_trace_are_two_trials(sc):
    case = _case("D06")
    [resp] = _send_case(sc, "D06")
    assert not resp.HasField("partial_success")
    _flush(sc)
    tid = _spans_of(case["requests"][0]["body"])[0]["traceId"]
    trials = _trials_of(sc, [tid])
    # chat-agent 0.1 s..5.0 s and title-agent 0.2 s..1.1 s both hang off the uncollected span
    # ffffffffffff0606: neither is a descendant of the other
    assert [(t["agent_name"], t["task_id"], t["outcome"], t["actions"]) for t in trials] == [
        ("chat-agent", "chat-06", "success", ["llm", "search_kb", "llm"]),
        ("title-agent", "title-06", "failure", ["llm"]),
    ]
    chat, title = trials
    assert (chat["input_tokens"], chat["output_tokens"]) == (1000, 80)  # 2 x (500, 40)
    assert (title["input_tokens"], title["output_tokens"]) == (120, 8)
    assert all("remote_parent" in t["flags"] for t in trials)


def test_nested_agent_exported_before_its_root_leaves_no_ghost_group(sc):
    tid, root_id, sub_id, llm_id = "6a" * 16, "6a" * 8, "6b" * 8, "6c" * 8

    def agent(sid, name, parent="", start=0, end=9):
        attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                 {"key": "gen_ai.agent.name", "value": {"stringValue": name}}]
        sp = _span(tid, sid, attrs, name=f"invoke_agent {name}", kind=1,
                   startTimeUnixNano=str(1760000000_000000000 + start * 10**8),
                   endTimeUnixNano=str(1760000000_000000000 + end * 10**8))
        if parent:
            sp["parentSpanId"] = parent
        return sp

    sub = agent(sub_id, "ghost-sub", parent=root_id, start=2, end=6)
    llm = _span(tid, llm_id, [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                              {"key": "gen_ai.request.model", "value": {"stringValue": "m"}}],
                parentSpanId=sub_id, startTimeUnixNano="1760000000300000000",
                endTimeUnixNano="1760000000500000000")
    _ok(_post(sc, _body(sub, llm, service="ghost-svc")))
    _flush(sc)  # the nested run is scored as a provisional root (its parent is not here yet)
    assert [g["agent"] for g in sc.report()["groups"] if g["agent"].startswith("ghost-")] == ["ghost-sub"]
    _ok(_post(sc, _body(agent(root_id, "ghost-main", start=0, end=9), service="ghost-svc")))
    _flush(sc)
    [t] = _trials_of(sc, [tid])
    assert (t["agent_name"], t["root_span_id"], t["actions"]) == ("ghost-main", root_id, ["llm"])
    assert [g["agent"] for g in sc.report()["groups"] if g["agent"].startswith("ghost-")] == ["ghost-main"]
    agents = {dict(ls).get("agent") for (n, ls), _ in _counters(sc).items() if n.startswith("relyscope_")}
    assert "ghost-sub" not in agents and "ghost-main" in agents


def test_d03_handoff_started_in_a_new_trace_is_stitched_to_the_run_it_continues(sc):
    body = _case("D03")["requests"][0]["body"]
    [resp] = _send_case(sc, "D03")
    assert not resp.HasField("partial_success")
    _flush(sc)
    triage, billing = "0301abababababababababababababab", "0302abababababababababababababab"
    trials = _trials_of(sc, [triage, billing])
    assert len(trials) == 1  # one user request = one run of billing-42
    [t] = trials
    assert (t["trace_id"], t["root_span_id"], t["agent_name"]) == (triage, "0301cdcdcdcdcdcd", "triage-agent")
    assert (t["task_id"], t["task_id_source"], t["outcome"]) == ("billing-42", "attribute", "success")
    # the triage model call, the transfer, then the billing agent's model call, refund, model call
    assert t["actions"][0] == "llm" and t["actions"][2:] == ["llm", "issue_refund", "llm"]
    assert t["actions"][1] in ("transfer_to_billing_agent", "handoff:billing-agent")
    assert "linked_continuation" in t["flags"]
    assert t["span_count"] == len(_spans_of(body)) == 7
    assert (t["model_calls"], t["input_tokens"], t["output_tokens"]) == (3, 1500, 120)  # 3 x (500, 40)
    [refund] = [s for s in t["steps"] if s["action"] == "issue_refund"]
    assert refund["arguments"] == {"invoice": "2026-05", "amount": 19.0}
    assert not [g for g in sc.report()["groups"] if g["agent"] == "billing-agent"]


def test_d21_evaluation_on_a_linked_evaluator_span_grades_the_run(sc):
    body = _case("D21")["requests"][0]["body"]
    [resp] = _send_case(sc, "D21")
    assert not resp.HasField("partial_success")
    _flush(sc)
    run1, evaluator, run3 = ("2101abababababababababababababab", "2102abababababababababababababab",
                             "2103abababababababababababababab")
    trials = _trials_of(sc, [run1, evaluator, run3])
    assert [t["trace_id"] for t in trials] == [run1, run3]  # the evaluator is not a trial
    t1, t3 = trials
    # run 1 has no outcome attribute: the evaluator's linked event (score 0.0) fails it
    assert (t1["task_id"], t1["outcome"], t1["outcome_source"]) == ("eval-21", "failure",
                                                                   "evaluation:task_success")
    assert "linked_evaluation" in t1["flags"]
    assert (t3["task_id"], t3["outcome"], t3["outcome_source"]) == ("eval-21", "success",
                                                                   "evaluation:task_success")
    [g] = [g for g in sc.report()["groups"] if g["agent"] == "support" and g["run_kind"] == "production"
           and g["tasks"] == 1 and g["trials"] == 2] or [None]
    assert g is not None, sc.report()["groups"]
    sr = g["metrics"]["success_rate"]
    assert sr["value"] == 0.5  # 1 success of 2 known outcomes


# ---- unknown usage is not zero; usage on the agent span ------------------------------------------

def _run(tid: str, task: str, *, usage: tuple[int, int] | None, agent_usage=None, cost=None,
         agent: str = "usage-agent") -> dict:
    """An agent run: root, one model call (with or without usage), one tool call; fixed timing."""
    t0 = 1760000000_000000000
    root_attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                  {"key": "gen_ai.agent.name", "value": {"stringValue": agent}},
                  {"key": "relyscope.task.id", "value": {"stringValue": task}},
                  {"key": "relyscope.outcome", "value": {"stringValue": "success"}}]
    if agent_usage:
        root_attrs += [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": str(agent_usage[0])}},
                       {"key": "gen_ai.usage.output_tokens", "value": {"intValue": str(agent_usage[1])}}]
    if cost is not None:
        root_attrs.append({"key": "operation.cost", "value": {"doubleValue": cost}})
    llm_attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                 {"key": "gen_ai.request.model", "value": {"stringValue": "m"}}]
    if usage:
        llm_attrs += [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": str(usage[0])}},
                      {"key": "gen_ai.usage.output_tokens", "value": {"intValue": str(usage[1])}}]
    root = _span(tid, tid[:16], root_attrs, name=f"invoke_agent {agent}", kind=1,
                 startTimeUnixNano=str(t0), endTimeUnixNano=str(t0 + 3 * 10**9))
    llm = _span(tid, tid[16:24] + "00000001", llm_attrs, parentSpanId=tid[:16],
                startTimeUnixNano=str(t0 + 10**8), endTimeUnixNano=str(t0 + 10**9))
    tool = _span(tid, tid[16:24] + "00000002", [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
        {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}}], name="execute_tool lookup",
        kind=1, parentSpanId=tid[:16], startTimeUnixNano=str(t0 + 11 * 10**8),
        endTimeUnixNano=str(t0 + 2 * 10**9))
    return _body(root, llm, tool, service="usage-svc")


def test_unknown_usage_stays_unknown_through_c_res(sc):
    a, b = "5a" * 16, "5b" * 16
    _ok(_post(sc, _run(a, "usage-task", usage=(100, 20))))
    _ok(_post(sc, _run(b, "usage-task", usage=None)))
    _flush(sc)
    ta, tb = _trials_of(sc, [a]), _trials_of(sc, [b])
    assert [(t["input_tokens"], t["output_tokens"], t["total_tokens"]) for t in ta] == [(100, 20, 120)]
    assert [(t["input_tokens"], t["output_tokens"], t["total_tokens"]) for t in tb] == [(None, None, None)]
    g = _group(sc, "usage-agent")
    # identical runs (same wall time, 1 model call, 1 tool call, no errors); tokens known for one
    # only (a single value: no CV), cost for none: every usable CV is 0, so C_res = exp(0) = 1.
    # Counting the unknown run as 0 tokens would give CV(120, 0) = sqrt(2) over 4 resources:
    # exp(-sqrt(2)/4) = 0.702.
    assert g["metrics"]["C_res"]["value"] == pytest.approx(1.0)


def test_usage_and_cost_on_the_agent_span_count_when_no_model_call_has_them(sc):
    c = "5c" * 16
    _ok(_post(sc, _run(c, "agent-usage-task", usage=None, agent_usage=(300, 30), cost=0.0042,
                       agent="agent-usage-agent")))
    _flush(sc)
    [t] = _trials_of(sc, [c])
    assert (t["input_tokens"], t["output_tokens"], t["total_tokens"]) == (300, 30, 330)
    assert t["cost_usd"] == pytest.approx(0.0042)


# ---- D15: tool calls the model asked for are graded without a tool span; MCP -------------------

@pytest.fixture(scope="module")
def policy_sc(tmp_path_factory):
    """A sidecar with D15's safety policy (forbidden delete_account, critical)."""
    d = tmp_path_factory.mktemp("policy")
    pol = d / "policy.yaml"
    pol.write_text(_case("D15")["sidecar"]["policy"])
    s = start_sidecar(d, extra_env={"RELYSCOPE_POLICY_FILE": str(pol)})
    try:
        yield s
    finally:
        _stop(s)


def test_d15_client_side_tool_without_tool_span_is_graded_by_the_policy(policy_sc):
    sc = policy_sc
    [resp] = _send_case(sc, "D15")
    assert not resp.HasField("partial_success")
    _flush(sc)
    client, server = "1501abababababababababababababab", "1502abababababababababababababab"
    t1, t2 = _trials_of(sc, [client, server])
    assert (t1["trace_id"], t2["trace_id"]) == (client, server)
    # both runs asked for delete_account; only run 2 has the ai.toolCall span
    assert t1["actions"] == t2["actions"] == ["llm", "delete_account"]
    [step1] = [s for s in t1["steps"] if s["action"] == "delete_account"]
    assert step1["tool_call_id"] == "call_del1" and set(step1["flags"]) == {"missing_tool_span", "client_side"}
    assert step1["arguments"] == {"user_id": "u-123"}
    assert t1["tool_calls"] == t2["tool_calls"] == 1
    g = _group(sc, "account-bot")
    [v] = [v for v in g["violations"] if v["rule"] == "no-account-deletion"]
    assert v["trials"] == 2 and v["attempted"] + v["committed"] == 2  # one per run, as for run 2
    assert g["metrics"]["S_comp"]["value"] == 0.0  # both runs violate a critical rule


def _mcp_run(tid: str, *, is_error: bool) -> dict:
    """An agent run whose one tool call is seen by the MCP client span and the server span."""
    t0 = 1760000000_000000000
    root = _span(tid, tid[:16], [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
        {"key": "gen_ai.agent.name", "value": {"stringValue": "mcp-agent"}},
        {"key": "relyscope.task.id", "value": {"stringValue": "mcp-task"}}],
        name="invoke_agent mcp-agent", kind=1, startTimeUnixNano=str(t0), endTimeUnixNano=str(t0 + 10**9))
    result = json.dumps({"content": [{"type": "text", "text": "no such file"}], "isError": is_error})

    def tools_call(sid, parent, kind, extra):
        return _span(tid, sid, [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "mcp.method.name", "value": {"stringValue": "tools/call"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "read_file"}}, *extra],
            name="tools/call read_file", kind=kind, parentSpanId=parent,
            startTimeUnixNano=str(t0 + 10**8), endTimeUnixNano=str(t0 + 5 * 10**8))
    client = tools_call(tid[16:24] + "00000001", tid[:16], 3,
                        [{"key": "gen_ai.tool.call.id", "value": {"stringValue": "call_m1"}}])
    server = tools_call(tid[16:24] + "00000002", client["spanId"], 2,
                        [{"key": "gen_ai.tool.call.result", "value": {"stringValue": result}}])
    return _body(root, client, server, service="mcp-svc")


@pytest.mark.parametrize("is_error", [False, True])
def test_mcp_client_and_server_spans_are_one_tool_call_and_is_error_fails_it(sc, is_error):
    tid = ("7e" if is_error else "7d") * 16
    _ok(_post(sc, _mcp_run(tid, is_error=is_error)))
    _flush(sc)
    [t] = _trials_of(sc, [tid])
    assert t["actions"] == ["read_file"] and t["tool_calls"] == 1
    [step] = t["steps"]
    assert step["span_id"] == tid[16:24] + "00000001"  # the client span (the agent's view)
    assert t["tool_errors"] == (1 if is_error else 0)
    assert step["error"] == ("tool_error" if is_error else None)


# ---- agent names from the framework's own record; causal step order under clock skew -------------

def _oi(tid: str, sid: str, name: str, kind: str, parent: str = "", start=0, end=9, scope="x", **attrs):
    a = [{"key": "openinference.span.kind", "value": {"stringValue": kind}}]
    a += [{"key": k.replace("__", "."), "value": {"stringValue": v} if isinstance(v, str) else {"intValue": str(v)}}
          for k, v in attrs.items()]
    sp = _span(tid, sid, a, name=name, kind=1, startTimeUnixNano=str(1760000000_000000000 + start * 10**8),
               endTimeUnixNano=str(1760000000_000000000 + end * 10**8))
    if parent:
        sp["parentSpanId"] = parent
    return sp


def _scoped(spans: list[dict], scope: str, service: str) -> dict:
    b = _body(*spans, service=service)
    b["resourceSpans"][0]["scopeSpans"][0]["scope"] = {"name": scope}
    return b


def test_agent_name_comes_from_the_framework_not_the_service(sc):
    scope = "openinference.instrumentation.openai_agents"
    bodies = []
    for i, agent in enumerate(["Triage agent", "Billing agent"]):
        tid = f"8{i}" * 16
        root = _oi(tid, tid[:16], "Agent workflow", "AGENT", end=9)  # the bridge's parentless root
        inner = _oi(tid, tid[16:24] + "00000001", agent, "AGENT", parent=tid[:16], start=1, end=8)
        llm = _oi(tid, tid[16:24] + "00000002", "response", "LLM", parent=inner["spanId"], start=2, end=3,
                  llm__model_name="gpt-4o")
        bodies.append((tid, _scoped([root, inner, llm], scope, "agents-svc")))
    # LangGraph (OpenInference LangChain): a named graph is the agent; the default name is not
    for i, graph in enumerate(["weather-graph", "LangGraph"]):
        tid = f"9{i}" * 16
        root = _oi(tid, tid[:16], graph, "CHAIN", end=9)
        llm = _oi(tid, tid[16:24] + "00000001", "ChatOpenAI", "LLM", parent=tid[:16], start=1, end=2,
                  llm__model_name="gpt-4o")
        bodies.append((tid, _scoped([root, llm], "openinference.instrumentation.langchain", "graph-svc")))
    for _, b in bodies:
        _ok(_post(sc, b))
    _flush(sc)
    names = [t["agent_name"] for tid, _ in bodies for t in _trials_of(sc, [tid])]
    assert names == ["Triage agent", "Billing agent", "weather-graph", "graph-svc"]
    agents = {g["agent"] for g in sc.report()["groups"]}
    assert {"Triage agent", "Billing agent"} <= agents and "agents-svc" not in agents


def _skew_run(tid: str, tool_skew_s: float) -> dict:
    """root 0–5 s; chat 0.1–1.0 s asks for call id <tid>-1; the tool (another service, its clock
    ``tool_skew_s`` behind) ran 1.1–2.0 s; chat 2.1–3.0 s."""
    t0 = 1760000000_000000000

    def at(s):
        return str(t0 + int(s * 1e9))
    call = f"call-{tid[:6]}"
    root = _span(tid, tid[:16], [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
        {"key": "gen_ai.agent.name", "value": {"stringValue": "skew-agent"}},
        {"key": "relyscope.task.id", "value": {"stringValue": "skew-task"}},
        {"key": "relyscope.outcome", "value": {"stringValue": "success"}}],
        name="invoke_agent skew-agent", kind=1, startTimeUnixNano=at(0), endTimeUnixNano=at(5))
    out = json.dumps([{"role": "assistant", "parts": [{"type": "tool_call", "id": call, "name": "lookup",
                                                       "arguments": {}}]}])
    llm1 = _span(tid, tid[16:24] + "00000001", [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
        {"key": "gen_ai.output.messages", "value": {"stringValue": out}}],
        parentSpanId=tid[:16], startTimeUnixNano=at(0.1), endTimeUnixNano=at(1.0))
    tool = _span(tid, tid[16:24] + "00000002", [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
        {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}},
        {"key": "gen_ai.tool.call.id", "value": {"stringValue": call}}],
        name="execute_tool lookup", kind=2, parentSpanId=tid[:16],
        startTimeUnixNano=at(1.1 - tool_skew_s), endTimeUnixNano=at(2.0 - tool_skew_s))
    llm2 = _span(tid, tid[16:24] + "00000003", [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
        parentSpanId=tid[:16], startTimeUnixNano=at(2.1), endTimeUnixNano=at(3.0))
    return _body(root, llm1, tool, llm2, service="skew-svc")


def test_step_order_follows_causality_under_clock_skew(sc):
    # on time; 1.5 s behind (the tool "starts" before its parent run: -0.4 s); 1.05 s behind
    # (0.05 s: inside the run, but before the model call that asked for it)
    runs = {"ab" * 16: 0.0, "ac" * 16: 1.5, "ad" * 16: 1.05}
    for tid, skew in runs.items():
        _ok(_post(sc, _skew_run(tid, skew)))
    _flush(sc)
    for tid in runs:
        [t] = _trials_of(sc, [tid])
        # by raw start times both skewed runs would read lookup, llm, llm
        assert t["actions"] == ["llm", "lookup", "llm"], (tid, t["actions"])
    g = _group(sc, "skew-agent")
    assert g["metrics"]["C_traj"]["value"] == pytest.approx(1.0)  # identical trajectories


# ---- OTLP logs and metrics ------------------------------------------------------------------------

def _eval_run(tid: str, agent: str) -> dict:
    t0 = 1760000000_000000000
    root = _span(tid, tid[:16], [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
        {"key": "gen_ai.agent.name", "value": {"stringValue": agent}},
        {"key": "relyscope.task.id", "value": {"stringValue": "logs-task"}}],
        name=f"invoke_agent {agent}", kind=1, startTimeUnixNano=str(t0), endTimeUnixNano=str(t0 + 10**9))
    llm = _span(tid, tid[16:24] + "00000001", [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}], parentSpanId=tid[:16],
        startTimeUnixNano=str(t0 + 10**8), endTimeUnixNano=str(t0 + 5 * 10**8))
    return _body(root, llm, service="logs-svc")


def _eval_attrs(score: float, label: str) -> list[dict]:
    return [{"key": "gen_ai.evaluation.name", "value": {"stringValue": "task_success"}},
            {"key": "gen_ai.evaluation.score.value", "value": {"doubleValue": score}},
            {"key": "gen_ai.evaluation.score.label", "value": {"stringValue": label}}]


def test_otlp_json_logs_genai_event_joins_its_span_and_others_are_counted(sc):
    tid = "b1" * 16
    _ok(_post(sc, _eval_run(tid, "logs-agent-http")))
    logs = {"resourceLogs": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "evaluator"}}]},
        "scopeLogs": [{"scope": {"name": "evals"}, "logRecords": [
            {"timeUnixNano": "1760000002000000000", "eventName": "gen_ai.evaluation.result",
             "traceId": tid, "spanId": tid[:16], "attributes": _eval_attrs(0.0, "fail")},
            {"timeUnixNano": "1760000002000000000", "severityText": "INFO",
             "body": {"stringValue": "an ordinary application log line"}},
        ]}]}]}
    before = _counters(sc)
    r = _post(sc, logs, path="/v1/logs")
    assert r.status_code == 200 and r.json() == {}, r.text
    _flush(sc)
    [t] = _trials_of(sc, [tid])
    assert (t["outcome"], t["outcome_source"]) == ("failure", "evaluation:task_success")
    keys = sc.get("/api/v1/spans", params={"trace_id": tid}).json()["keys"]
    assert len(keys) == 3  # root, model call, and the joined event record
    after = _counters(sc)
    name = "relyscope_otlp_log_records_total"
    assert _sum(after, name, kind="joined") - _sum(before, name, kind="joined") == 1
    assert _sum(after, name, kind="other") - _sum(before, name, kind="other") == 1
    # a re-sent record is stored once
    assert _post(sc, logs, path="/v1/logs").status_code == 200
    _flush(sc)
    assert len(sc.get("/api/v1/spans", params={"trace_id": tid}).json()["keys"]) == 3


def test_grpc_logs_service_joins_evaluation_event(sc):
    import grpc
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest, ExportLogsServiceResponse)

    tid = "b2" * 16
    _ok(_post(sc, _eval_run(tid, "logs-agent-grpc")))
    req = ExportLogsServiceRequest()
    rec = req.resource_logs.add().scope_logs.add().log_records.add(
        time_unix_nano=1760000002000000000, trace_id=bytes.fromhex(tid), span_id=bytes.fromhex(tid[:16]))
    rec.attributes.add(key="event.name").value.string_value = "gen_ai.evaluation.result"  # older SDKs
    for kv in _eval_attrs(1.0, "pass"):
        a = rec.attributes.add(key=kv["key"])
        if "doubleValue" in kv["value"]:
            a.value.double_value = kv["value"]["doubleValue"]
        else:
            a.value.string_value = kv["value"]["stringValue"]
    with grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        call = ch.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                              request_serializer=None, response_deserializer=None)
        resp = ExportLogsServiceResponse.FromString(call(req.SerializeToString(), timeout=30))
    assert not resp.HasField("partial_success")
    _flush(sc)
    [t] = _trials_of(sc, [tid])
    assert (t["outcome"], t["outcome_source"]) == ("success", "evaluation:task_success")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sdk_metric_exporters_are_acknowledged_and_counted(sc, protocol):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExportResult

    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        exporter = OTLPMetricExporter(endpoint=f"{sc.otlp_http}/v1/metrics")
    else:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        exporter = OTLPMetricExporter(endpoint=f"127.0.0.1:{sc.grpc_port}", insecure=True)
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    counter = mp.get_meter("t").create_counter("requests")
    counter.add(3, {"route": "/a"})
    counter.add(1, {"route": "/b"})  # 2 data points (one per attribute set) of one sum
    data = reader.get_metrics_data()
    before = _counters(sc)
    assert exporter.export(data, timeout_millis=10_000) is MetricExportResult.SUCCESS
    exporter.shutdown()
    mp.shutdown()
    after = _counters(sc)
    name = "relyscope_otlp_metric_points_total"
    assert _sum(after, name, type="sum") - _sum(before, name, type="sum") == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sdk_log_exporter_genai_event_in_span_context_grades_the_run(sc, protocol):
    """The OTel SDK's own exporters: spans over gRPC, a GenAI evaluation event emitted through the
    Logs API inside the agent span (so the record carries its trace and span id) over ``protocol``."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        log_exp = OTLPLogExporter(endpoint=f"{sc.otlp_http}/v1/logs")
    else:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        log_exp = OTLPLogExporter(endpoint=f"127.0.0.1:{sc.grpc_port}", insecure=True)
    res = Resource.create({"service.name": "sdk-logs-svc"})
    tp = TracerProvider(resource=res)
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{sc.grpc_port}", insecure=True)))
    lp = LoggerProvider(resource=res)
    lp.add_log_record_processor(SimpleLogRecordProcessor(log_exp))
    tracer, logger = tp.get_tracer("t"), lp.get_logger("evals")
    agent = f"sdk-logs-{protocol}"
    with tracer.start_as_current_span(f"invoke_agent {agent}") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        root.set_attribute("gen_ai.agent.name", agent)
        root.set_attribute("relyscope.task.id", "sdk-logs-task")
        with tracer.start_as_current_span("chat m") as llm:
            llm.set_attribute("gen_ai.operation.name", "chat")
        logger.emit(event_name="gen_ai.evaluation.result",
                    attributes={"gen_ai.evaluation.name": "judge", "gen_ai.evaluation.score.value": 0.9})
        tid = f"{root.get_span_context().trace_id:032x}"
    lp.force_flush()
    tp.force_flush()
    lp.shutdown()
    tp.shutdown()
    _flush(sc)
    [t] = _trials_of(sc, [tid])
    assert (t["agent_name"], t["outcome"], t["outcome_source"]) == (agent, "success", "evaluation:judge")


def test_vercel_ai_usage_on_the_outer_call_counts_when_the_model_call_has_none(sc):
    tid = "5d" * 16
    t0 = 1760000000_000000000
    outer = _span(tid, tid[:16], [
        {"key": "ai.operationId", "value": {"stringValue": "ai.generateText"}},
        {"key": "ai.model.id", "value": {"stringValue": "gpt-4o"}},
        {"key": "ai.usage.promptTokens", "value": {"intValue": "50"}},
        {"key": "ai.usage.completionTokens", "value": {"intValue": "7"}},
        {"key": "relyscope.task.id", "value": {"stringValue": "vercel-usage"}}],
        name="ai.generateText", kind=1, startTimeUnixNano=str(t0), endTimeUnixNano=str(t0 + 10**9))
    inner = _span(tid, tid[16:24] + "00000001", [
        {"key": "ai.operationId", "value": {"stringValue": "ai.generateText.doGenerate"}},
        {"key": "ai.model.id", "value": {"stringValue": "gpt-4o"}}], name="ai.generateText.doGenerate",
        parentSpanId=tid[:16], startTimeUnixNano=str(t0 + 10**8), endTimeUnixNano=str(t0 + 9 * 10**8))
    _ok(_post(sc, _body(outer, inner, service="vercel-svc")))
    _flush(sc)
    [t] = _trials_of(sc, [tid])
    assert t["actions"] == ["llm"] and t["model_calls"] == 1
    assert (t["input_tokens"], t["output_tokens"], t["total_tokens"]) == (50, 7, 57)
