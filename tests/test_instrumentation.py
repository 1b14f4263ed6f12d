"""relyscope.instrumentation: spans and attributes as conventions.md §1–2 say (real OTel SDK).

Expected attribute names are written out literally here (from conventions.md), not taken from
relyscope.semconv, so a wrong constant fails the test.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import subprocess
import sys

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from relyscope.instrumentation import (
    agent_run,
    configure,
    llm_call,
    record_claimed_success,
    record_confidence,
    record_decision,
    record_outcome,
    set_redactor,
    tool_call,
    use_tracer_provider,
)
from relyscope.instrumentation.otlp_json import OTLPJsonFileExporter
from relyscope.testing import http_stub


@pytest.fixture
def mem():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_name(exporter):
    return {s.name: s for s in exporter.get_finished_spans()}


# --- agent_run -----------------------------------------------------------------------------------
def test_agent_run_root_attributes(mem):
    tp, exp = mem
    with agent_run(
        "support",
        task_id="refund-17",
        version="2.1.0",
        run_kind="canary",
        conversation_id="conv-9",
        agent_id="agt_1",
        tracer_provider=tp,
    ):
        pass
    (span,) = exp.get_finished_spans()
    assert span.name == "invoke_agent support"
    assert span.kind == SpanKind.INTERNAL
    assert span.parent is None
    assert dict(span.attributes) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "support",
        "gen_ai.agent.id": "agt_1",
        "gen_ai.agent.version": "2.1.0",
        "gen_ai.conversation.id": "conv-9",
        "gen_ai.invocation.is_nested": False,
        "relyscope.task.id": "refund-17",
        "relyscope.run.kind": "canary",
    }
    assert span.status.status_code == StatusCode.UNSET


def test_agent_run_optional_attributes_absent(mem):
    tp, exp = mem
    with agent_run("bare", tracer_provider=tp):
        pass
    (span,) = exp.get_finished_spans()
    assert "gen_ai.conversation.id" not in span.attributes
    assert "gen_ai.agent.version" not in span.attributes
    assert "relyscope.task.id" not in span.attributes


def test_nested_agent_run_sets_is_nested_and_inherits_provider(mem):
    tp, exp = mem
    with agent_run("outer", tracer_provider=tp):
        with agent_run("inner"):  # no provider: inherits the enclosing run's
            pass
    spans = by_name(exp)
    outer, inner = spans["invoke_agent outer"], spans["invoke_agent inner"]
    assert outer.attributes["gen_ai.invocation.is_nested"] is False
    assert inner.attributes["gen_ai.invocation.is_nested"] is True
    assert inner.parent.span_id == outer.context.span_id
    assert inner.context.trace_id == outer.context.trace_id
    # after both closed, a new run is a root again
    with agent_run("again", tracer_provider=tp):
        pass
    assert by_name(exp)["invoke_agent again"].attributes["gen_ai.invocation.is_nested"] is False


class _Outer:
    class PolicyViolation(Exception):
        pass


def test_agent_run_exception_marks_error_and_reraises(mem):
    tp, exp = mem
    with pytest.raises(_Outer.PolicyViolation):
        with agent_run("a", tracer_provider=tp):
            raise _Outer.PolicyViolation("nope")
    (span,) = exp.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "_Outer.PolicyViolation"


def test_invalid_enums_raise():
    with pytest.raises(ValueError):
        agent_run("a", run_kind="staging")
    with pytest.raises(ValueError):
        tool_call("t", side_effect="dangerous")


# --- tool_call -----------------------------------------------------------------------------------
def test_tool_call_attributes_and_result(mem):
    tp, exp = mem
    with agent_run("a", tracer_provider=tp):
        with tool_call(
            "issue_refund",
            side_effect="irreversible",
            call_id="call_1",
            arguments={"order_id": "O-1", "amount": 12.5},
        ) as tool:
            tool.set_result({"refunded": True, "items": [1, 2]})
    spans = by_name(exp)
    span, root = spans["execute_tool issue_refund"], spans["invoke_agent a"]
    assert span.kind == SpanKind.INTERNAL
    assert span.parent.span_id == root.context.span_id
    a = span.attributes
    assert a["gen_ai.operation.name"] == "execute_tool"
    assert a["gen_ai.tool.name"] == "issue_refund"
    assert a["gen_ai.tool.call.id"] == "call_1"
    assert a["gen_ai.tool.type"] == "function"
    assert a["relyscope.tool.side_effect"] == "irreversible"
    assert json.loads(a["gen_ai.tool.call.arguments"]) == {"order_id": "O-1", "amount": 12.5}
    assert json.loads(a["gen_ai.tool.call.result"]) == {"refunded": True, "items": [1, 2]}
    assert span.status.status_code == StatusCode.UNSET


@pytest.mark.parametrize("result", ['{"status": "ok", "n": 2}', '[1, 2]', '"quoted"', "plain text", "{not json",
                                    '\x0c{"a": 1}', '\xa0[1, 2]', '\u2028"x"', '\x1c{}',  # Unicode whitespace first
                                    {"status": "ok"}, [1, 2]])
def test_tool_result_type_survives_the_collector(mem, result):
    """Bug: a tool that returned JSON *text* was recorded as that text, the collector decoded it,
    and a shadow replay handed the agent a dict where production had handed it a str (an agent
    doing ``json.loads(result)`` then crashed in every replay: false inconsistency). The value the
    collector decodes (its own ``decode_json_once``) must be the value the tool returned, type
    included."""
    from relyscope.collector.normalize._values import decode_json_once

    tp, exp = mem
    with tool_call("fetch", tracer_provider=tp) as tool:
        tool.set_result(result)
    (span,) = exp.get_finished_spans()
    back = decode_json_once(span.attributes["gen_ai.tool.call.result"])
    assert back == result and type(back) is type(result)


def test_tool_call_string_arguments_pass_through(mem):
    tp, exp = mem
    raw = '{"user_id": "mia_li_3668",   "x":1}'  # odd spacing must survive untouched
    with tool_call("get_user", arguments=raw, tracer_provider=tp):
        pass
    (span,) = exp.get_finished_spans()
    assert span.attributes["gen_ai.tool.call.arguments"] == raw
    assert "relyscope.tool.side_effect" not in span.attributes
    assert "gen_ai.tool.call.id" not in span.attributes


def test_tool_call_set_error(mem):
    tp, exp = mem
    with tool_call("search", tracer_provider=tp) as tool:
        tool.set_error("timeout", "took 10 s")
    (span,) = exp.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "took 10 s"
    assert span.attributes["error.type"] == "timeout"


def test_tool_call_exception_propagates_to_root(mem):
    tp, exp = mem
    with pytest.raises(KeyError):
        with agent_run("a", tracer_provider=tp):
            with tool_call("lookup"):
                raise KeyError("k")
    spans = by_name(exp)
    assert spans["execute_tool lookup"].attributes["error.type"] == "KeyError"
    assert spans["execute_tool lookup"].status.status_code == StatusCode.ERROR
    assert spans["invoke_agent a"].attributes["error.type"] == "KeyError"


# --- llm_call ------------------------------------------------------------------------------------
def test_llm_call_attributes(mem):
    tp, exp = mem
    with llm_call("gpt-4o", provider="openai", tracer_provider=tp) as llm:
        llm.set_usage(input_tokens=1200, output_tokens=85, cache_read_tokens=1024)
        llm.set_response(model="gpt-4o-2024-08-06", finish_reasons=["tool_calls"])
    (span,) = exp.get_finished_spans()
    assert span.name == "chat gpt-4o"
    assert span.kind == SpanKind.CLIENT
    assert dict(span.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.provider.name": "openai",
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 85,
        "gen_ai.usage.cache_read.input_tokens": 1024,
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.finish_reasons": ("tool_calls",),
    }
    with pytest.raises(ValueError):
        with llm_call("m", tracer_provider=tp) as llm:
            llm.set_usage(input_tokens=-1)


# --- record_* ------------------------------------------------------------------------------------
def test_record_outcome_from_inside_tool_lands_on_root(mem):
    tp, exp = mem
    with agent_run("a", tracer_provider=tp):
        with llm_call("m"):
            with tool_call("t"):
                record_outcome(True, score=0.75, source="db_state")
                record_confidence(0.9)
                record_claimed_success(False)
                record_decision("recover", reason="retry after 500")
    spans = by_name(exp)
    root, tool = spans["invoke_agent a"], spans["execute_tool t"]
    assert root.attributes["relyscope.outcome"] == "success"
    assert root.attributes["relyscope.outcome.score"] == 0.75
    assert root.attributes["relyscope.outcome.source"] == "db_state"
    assert root.attributes["relyscope.confidence"] == 0.9
    assert root.attributes["relyscope.claimed_success"] is False
    for key in ("relyscope.outcome", "relyscope.confidence", "relyscope.claimed_success"):
        assert key not in tool.attributes
        assert key not in spans["chat m"].attributes
    # decisions go on the current span, not the root
    assert tool.attributes["relyscope.decision"] == "recover"
    assert tool.attributes["relyscope.decision.reason"] == "retry after 500"
    assert "relyscope.decision" not in root.attributes


def test_record_outcome_values_and_nested_run_target(mem):
    tp, exp = mem
    with agent_run("outer", tracer_provider=tp):
        record_outcome(False)
        with agent_run("inner"):
            record_outcome(None)
    spans = by_name(exp)
    assert spans["invoke_agent outer"].attributes["relyscope.outcome"] == "failure"
    assert spans["invoke_agent inner"].attributes["relyscope.outcome"] == "unknown"


@pytest.mark.parametrize("bad", [-0.01, 1.5, float("nan")])
def test_confidence_and_score_validation(mem, bad):
    tp, _ = mem
    with agent_run("a", tracer_provider=tp):
        with pytest.raises(ValueError):
            record_confidence(bad)
        with pytest.raises(ValueError):
            record_outcome(True, score=bad)


def test_record_decision_validation(mem):
    tp, exp = mem
    with agent_run("a", tracer_provider=tp):
        with pytest.raises(ValueError):
            record_decision("delegate")
        for kind in ("act", "ask", "refuse", "stop", "confirm", "recover"):
            record_decision(kind)
        with tool_call("t", tracer_provider=tp):
            record_decision("confirm", reason="irreversible")
    spans = exp.get_finished_spans()
    # directly under the run: one zero-length child span per decision, in order
    decisions = [s for s in spans if s.name.startswith("decision ")]
    assert [s.attributes["relyscope.decision"] for s in decisions] == [
        "act", "ask", "refuse", "stop", "confirm", "recover"]
    assert all(s.start_time == s.end_time for s in decisions)
    root = next(s for s in spans if s.name == "invoke_agent a")
    assert all(s.parent.span_id == root.context.span_id for s in decisions)
    assert "relyscope.decision" not in root.attributes
    # inside a tool span: set on that span
    tool = next(s for s in spans if s.name == "execute_tool t")
    assert tool.attributes["relyscope.decision"] == "confirm"
    assert tool.attributes["relyscope.decision.reason"] == "irreversible"


def test_record_without_open_run_targets_current_span(mem):
    tp, exp = mem
    record_outcome(True)  # no span at all: a silent no-op
    record_decision("act")
    # a foreign instrumentation's root (no relyscope agent_run open): lands on the current span
    with tp.get_tracer("other").start_as_current_span("foreign root"):
        record_outcome(False, source="tests")
        record_confidence(0.5)
    (span,) = exp.get_finished_spans()
    assert span.attributes["relyscope.outcome"] == "failure"
    assert span.attributes["relyscope.outcome.source"] == "tests"
    assert span.attributes["relyscope.confidence"] == 0.5


# --- decorators ----------------------------------------------------------------------------------
def test_sync_decorators(mem):
    tp, exp = mem

    @tool_call("get_order", side_effect="read")
    def get_order(order_id, *, verbose=False):
        return {"order_id": order_id, "status": "shipped"}

    @agent_run("decorated", task_id="status", tracer_provider=tp)
    def handle(order_id):
        get_order(order_id, verbose=True)
        record_outcome(True)
        return "done"

    assert handle("O-7") == "done"
    assert handle("O-8") == "done"  # a fresh span per call
    spans = exp.get_finished_spans()
    roots = [s for s in spans if s.name == "invoke_agent decorated"]
    tools = [s for s in spans if s.name == "execute_tool get_order"]
    assert len(roots) == 2 and len(tools) == 2
    assert roots[0].context.trace_id != roots[1].context.trace_id
    assert json.loads(tools[0].attributes["gen_ai.tool.call.arguments"]) == {
        "order_id": "O-7",
        "verbose": True,
    }
    assert json.loads(tools[1].attributes["gen_ai.tool.call.result"]) == {
        "order_id": "O-8",
        "status": "shipped",
    }
    assert all(r.attributes["relyscope.outcome"] == "success" for r in roots)


def test_async_decorators_and_concurrent_runs(mem):
    tp, exp = mem

    @tool_call("fetch")
    async def fetch(key):
        await asyncio.sleep(0.001)
        if key == "bad":
            raise TimeoutError("slow")
        return key.upper()

    @agent_run("async-agent", tracer_provider=tp)
    async def run(key):
        try:
            await fetch(key)
            record_outcome(True)
        except TimeoutError:
            record_outcome(False)

    async def main():
        await asyncio.gather(run("ok"), run("bad"))

    asyncio.run(main())
    spans = exp.get_finished_spans()
    roots = [s for s in spans if s.name == "invoke_agent async-agent"]
    tools = {s.context.trace_id: s for s in spans if s.name == "execute_tool fetch"}
    assert len(roots) == 2
    outcomes = {}
    for root in roots:
        assert root.attributes["gen_ai.invocation.is_nested"] is False  # concurrent, not nested
        tool = tools[root.context.trace_id]
        assert tool.parent.span_id == root.context.span_id
        outcomes[json.loads(tool.attributes["gen_ai.tool.call.arguments"])["key"]] = (
            root.attributes["relyscope.outcome"],
            tool.attributes.get("error.type"),
        )
    assert outcomes == {"ok": ("success", None), "bad": ("failure", "TimeoutError")}


def test_async_with_context_manager(mem):
    tp, exp = mem

    async def main():
        async with agent_run("am", tracer_provider=tp):
            async with llm_call("m") as llm:
                llm.set_usage(output_tokens=3)

    asyncio.run(main())
    spans = by_name(exp)
    assert spans["chat m"].parent.span_id == spans["invoke_agent am"].context.span_id


def test_generator_decoration_rejected():
    with pytest.raises(TypeError):

        @tool_call("gen")
        def gen():
            yield 1


# --- provider selection / redaction --------------------------------------------------------------
def test_use_tracer_provider_default(mem):
    tp, exp = mem
    previous = use_tracer_provider(tp)
    try:
        with tool_call("solo"):
            pass
    finally:
        use_tracer_provider(previous)
    assert [s.name for s in exp.get_finished_spans()] == ["execute_tool solo"]


def test_redactor_applies_to_content_only(mem):
    tp, exp = mem
    seen = []

    def redact(name, value):
        seen.append(name)
        if name == "gen_ai.tool.call.result":
            return None  # drop
        return re.sub(r"\d", "#", value)

    previous = set_redactor(redact)
    try:
        with tool_call("t", call_id="c42", arguments={"card": "4111"}, tracer_provider=tp) as t:
            t.set_result("secret 123")
        with llm_call("m", tracer_provider=tp) as llm:
            llm.set_output_messages([{"role": "assistant", "parts": [{"content": "pin 99"}]}])
    finally:
        set_redactor(previous)
    spans = by_name(exp)
    tool = spans["execute_tool t"].attributes
    assert tool["gen_ai.tool.call.arguments"] == '{"card":"####"}'
    assert "gen_ai.tool.call.result" not in tool
    assert tool["gen_ai.tool.call.id"] == "c42"  # not content: untouched
    assert "pin ##" in spans["chat m"].attributes["gen_ai.output.messages"]
    assert sorted(seen) == [
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    ]


def test_raising_redactor_fails_closed(mem):
    tp, exp = mem

    def broken(name, value):
        raise RuntimeError("bug")

    previous = set_redactor(broken)
    try:
        with tool_call("t", arguments={"ssn": "123"}, tracer_provider=tp):
            pass
    finally:
        set_redactor(previous)
    (span,) = exp.get_finished_spans()
    assert "gen_ai.tool.call.arguments" not in span.attributes


# --- import isolation ----------------------------------------------------------------------------
def test_instrumentation_imports_nothing_of_the_sidecar():
    forbidden = [
        "relyscope.collector",
        "relyscope.store",
        "relyscope.scorers",
        "relyscope.exporter",
        "fastapi",
        "chdb",
        "clickhouse_connect",
        "numpy",
        "scipy",
    ]
    code = (
        "import relyscope.instrumentation, sys, json;"
        f"print(json.dumps([m for m in {forbidden!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout) == []


# --- OTLP/JSON file exporter ---------------------------------------------------------------------
def test_otlp_json_file_exporter(tmp_path):
    path = tmp_path / "spans.jsonl"
    exporter = OTLPJsonFileExporter(path)
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    mem_exp = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(mem_exp))
    with agent_run("j", tracer_provider=tp):
        with llm_call("m") as llm:
            llm.set_usage(input_tokens=123)
    tp.shutdown()
    exporter.shutdown()  # idempotent after the provider's shutdown

    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2  # SimpleSpanProcessor: one export (= one line) per span
    expected = {s.name: s for s in mem_exp.get_finished_spans()}
    for line in lines:
        req = json.loads(line)
        (span,) = req["resourceSpans"][0]["scopeSpans"][0]["spans"]
        sdk_span = expected[span["name"]]
        assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"])
        assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"])
        assert int(span["traceId"], 16) == sdk_span.context.trace_id
        assert int(span["spanId"], 16) == sdk_span.context.span_id
        assert span["startTimeUnixNano"] == str(sdk_span.start_time)
        assert span["endTimeUnixNano"] == str(sdk_span.end_time)
        assert isinstance(span["kind"], int)
        if span["name"] == "chat m":
            assert span["kind"] == 3  # SPAN_KIND_CLIENT
            assert re.fullmatch(r"[0-9a-f]{16}", span["parentSpanId"])
            assert int(span["parentSpanId"], 16) == sdk_span.parent.span_id
            attrs = {a["key"]: a["value"] for a in span["attributes"]}
            assert attrs["gen_ai.usage.input_tokens"] == {"intValue": "123"}
        else:
            assert "parentSpanId" not in span
    from opentelemetry.sdk.trace.export import SpanExportResult

    assert exporter.export(mem_exp.get_finished_spans()) == SpanExportResult.FAILURE


# --- configure -----------------------------------------------------------------------------------
def test_configure_with_custom_exporter_and_validation():
    exp = InMemorySpanExporter()
    tp = configure(service_name="svc", service_version="9.9", exporter=exp, batch=False)
    with agent_run("c", tracer_provider=tp):
        pass
    tp.shutdown()
    (span,) = exp.get_finished_spans()
    assert span.resource.attributes["service.name"] == "svc"
    assert span.resource.attributes["service.version"] == "9.9"
    with pytest.raises(ValueError):
        configure(protocol="thrift")


def test_configure_http_protobuf_sends_to_loopback_endpoint(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_COMPRESSION", raising=False)
    received: list[tuple[str, bytes, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, body, self.headers.get("x-token", "")))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    with http_stub(Handler) as port:
        tp = configure(
            f"http://127.0.0.1:{port}",
            protocol="http/protobuf",
            service_name="http-agent",
            headers={"x-token": "abc"},
            batch=False,
        )
        with agent_run("h", task_id="t1", tracer_provider=tp):
            pass
        tp.shutdown()
    assert len(received) == 1
    path, body, token = received[0]
    assert path == "/v1/traces"
    assert token == "abc"
    req = ExportTraceServiceRequest.FromString(body)
    rs = req.resource_spans[0]
    res = {a.key: a.value.string_value for a in rs.resource.attributes}
    assert res["service.name"] == "http-agent"
    (span,) = rs.scope_spans[0].spans
    assert span.name == "invoke_agent h"
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["relyscope.task.id"].string_value == "t1"
    assert attrs["gen_ai.invocation.is_nested"].bool_value is False
