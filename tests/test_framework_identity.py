"""Issue 12: task identity and outcomes for runs whose agent span a framework creates.

- the trajectory builder honours ``relyscope.task.id`` / outcome / confidence on the span around
  the trial root (the application's own span wrapping the framework's agent span);
- :class:`BaggageSpanProcessor` copies ``relyscope.task.id`` from OTel baggage onto the
  framework's spans, and :func:`task_baggage` tells the run's trace id;
- ``record_outcome(…, trace_id=…)`` after the run posts to the outcome API (stdlib only).

Spans go over real OTLP (the SDK's exporter) to one sidecar for the module.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from relyscope.collector.normalize import normalize
from relyscope.instrumentation import (BaggageSpanProcessor, OutcomePostError, agent_run, post_outcome,
                                       record_outcome, task_baggage, tool_call)
from relyscope.model import CanonicalSpan
from relyscope.testing import start_sidecar
from relyscope.trajectory import assemble

T = "5b8efff798038103d269b633813fc60c"
BASE = 1_760_000_000 * 10**9


def _sp(sid: str, parent: str, name: str, start: int, end: int, attrs: dict) -> CanonicalSpan:
    return CanonicalSpan(trace_id=T, span_id=sid * 16, parent_span_id=parent * 16 if parent else "",
                         name=name, kind=1, start_ns=BASE + start, end_ns=BASE + end, attributes=attrs,
                         resource={"service.name": "svc"})


def _assemble(*spans):
    [trial] = assemble(T, {s.span_id: (s, normalize(s)) for s in spans}, complete=True)
    return trial


APP = {"relyscope.task.id": "refund-42", "relyscope.outcome": "failure", "relyscope.confidence": 0.25}
AGENT = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "fw-agent"}
TOOL = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
CHAT = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}


def test_task_outcome_and_confidence_on_the_span_around_the_agent_root_are_honoured():
    t = _assemble(_sp("a", "", "handle_request", 0, 100, APP),
                  _sp("b", "a", "invoke_agent fw-agent", 10, 90, AGENT),
                  _sp("c", "b", "chat m", 20, 30, CHAT), _sp("d", "b", "execute_tool lookup", 40, 50, TOOL))
    assert t.root_span_id == "b" * 16 and t.agent_name == "fw-agent"
    assert (t.task_id, t.task_id_source) == ("refund-42", "attribute")
    assert (t.outcome, t.confidence) == ("failure", 0.25)
    assert t.actions == ("llm", "lookup")


def test_the_roots_own_values_win_over_the_enclosing_span():
    own = {**AGENT, "relyscope.task.id": "own", "relyscope.outcome": "success"}
    t = _assemble(_sp("a", "", "handle_request", 0, 100, APP), _sp("b", "a", "invoke_agent fw-agent", 10, 90, own))
    assert (t.task_id, t.outcome, t.confidence) == ("own", "success", 0.25)


def test_nearest_enclosing_span_wins_and_a_virtual_root_reads_its_top_span():
    mid = {"relyscope.task.id": "nearer"}
    t = _assemble(_sp("a", "", "outer", 0, 100, APP), _sp("m", "a", "middle", 5, 95, mid),
                  _sp("b", "m", "invoke_agent fw-agent", 10, 90, AGENT))
    assert t.task_id == "nearer" and t.outcome == "failure"
    # no agent span at all (a framework emitting only model and tool spans under the app's span)
    t = _assemble(_sp("a", "", "handle_request", 0, 100, APP), _sp("c", "a", "chat m", 20, 30, CHAT))
    assert t.root_span_id == "" and (t.task_id, t.outcome) == ("refund-42", "failure")


# ---- over the wire -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = start_sidecar(tmp_path_factory.mktemp("fw"))
    yield s
    s.kill()


def _provider(sc) -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    tp = TracerProvider(resource=Resource.create({"service.name": "baggage-svc"}))
    tp.add_span_processor(BaggageSpanProcessor())
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sc.otlp_http + "/v1/traces")))
    return tp


def test_baggage_gives_a_framework_span_its_task_id_and_the_outcome_is_posted_after_the_run(sc):
    tp = _provider(sc)
    tracer = tp.get_tracer("some.framework")  # stands for a framework's own instrumentation
    scopes = []
    for task, ok in (("bag-A", True), ("bag-A", False), ("bag-B", True)):
        with task_baggage(task_id=task) as scope:
            with tracer.start_as_current_span("invoke_agent fw", attributes=AGENT):
                with tracer.start_as_current_span("execute_tool lookup", attributes=TOOL):
                    pass
        scopes.append((scope, ok))
    tp.shutdown()
    for scope, ok in scopes:
        assert scope.trace_id is not None and len(scope.trace_ids) == 1
        reply = record_outcome(ok, trace_id=scope.trace_id, api=sc.api)
        assert reply["status"] == "recorded" and reply["key"] == scope.trace_id
    sc.flush()
    trials = {t["trace_id"]: t for t in sc.trials(agent="fw-agent")}
    assert len(trials) == 3
    for scope, ok in scopes:
        t = trials[scope.trace_id]
        assert (t["task_id"], t["task_id_source"]) == (scope.task_id, "attribute")
        assert t["outcome"] == ("success" if ok else "failure") and t["outcome_source"] == "verifier_api"
        assert t["actions"] == ["lookup"]
    g = [g for g in sc.report()["groups"] if g["agent"] == "fw-agent"][0]
    # bag-A 1/2, bag-B 1/1 → pass^1 = (0.5 + 1)/2; pass^2 over bag-A only: C(1,2)/C(2,2) = 0
    assert g["metrics"]["pass^1"]["value"] == 0.75 and g["metrics"]["pass^2"]["value"] == 0.0


def test_a_span_set_attribute_wins_over_baggage(sc):
    tp = TracerProvider()
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exp = InMemorySpanExporter()
    tp.add_span_processor(BaggageSpanProcessor())
    tp.add_span_processor(SimpleSpanProcessor(exp))
    with task_baggage(task_id="from-baggage", run_kind="canary"):
        with tp.get_tracer("t").start_as_current_span("x", attributes={"relyscope.task.id": "explicit"}):
            with tp.get_tracer("t").start_as_current_span("y"):
                pass
    outside = tp.get_tracer("t").start_span("z")
    outside.end()
    spans = {s.name: s.attributes for s in exp.get_finished_spans()}
    assert spans["x"]["relyscope.task.id"] == "explicit" and spans["x"]["relyscope.run.kind"] == "canary"
    assert spans["y"]["relyscope.task.id"] == "from-baggage"
    assert "relyscope.task.id" not in spans["z"]
    with pytest.raises(ValueError):
        with task_baggage(task_id="t", run_kind="prod"):
            pass


def test_agent_run_handle_trace_id_after_the_run(sc):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    tp = TracerProvider(resource=Resource.create({"service.name": "handle-svc"}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sc.otlp_http + "/v1/traces")))
    with agent_run("handle-agent", task_id="h", tracer_provider=tp) as run:
        with tool_call("search"):
            pass
    tp.shutdown()
    reply = record_outcome(False, trial_id=run.default_trial_id, api=sc.api, source="db_state")
    assert reply["key_kind"] == "trial" and reply["status"] == "recorded"
    sc.flush()
    [t] = sc.trials(agent="handle-agent")
    assert t["trial_id"] == run.default_trial_id and t["outcome"] == "failure"


def test_post_outcome_errors_name_the_reason(sc):
    with pytest.raises(OutcomePostError) as e:
        post_outcome(True, trace_id="not-hex", api=sc.api)
    assert e.value.status == 422 and "trace_id" in str(e.value)
    with pytest.raises(OutcomePostError) as e:
        post_outcome(True, trace_id="ab" * 16, api="http://127.0.0.1:9", timeout_s=2)
    assert e.value.status is None
    with pytest.raises(ValueError):
        post_outcome(True, api=sc.api)


def test_current_trace_id_inside_and_outside_a_span():
    from relyscope.instrumentation import current_trace_id

    tp = TracerProvider()
    assert current_trace_id() is None
    with tp.get_tracer("t").start_as_current_span("x") as s:
        assert current_trace_id() == format(s.get_span_context().trace_id, "032x")
