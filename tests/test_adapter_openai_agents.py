"""Issue 12: an OpenAI Agents SDK agent (the real package, its ScriptedModel: no network) scored.

The SDK's traces reach OTel through OpenInference's bridge; relyscope's trace processor puts task
id, agent name, outcome and confidence on the bridge's root span. Spans go over real OTLP/HTTP to
a sidecar started here. Five runs of each of two tasks:

- ``refund-42`` inside ``with trace(..., metadata=…)``, outcome and confidence recorded on the
  open trace (``proc.record``);
- ``track-7`` through ``RunConfig(trace_metadata=…, trace_id=…)``, the outcome posted after the
  run by the OTel trace id (``record_outcome(..., trace_id=proc.otel_trace_id(...))``).
"""

from __future__ import annotations

import sys
from math import comb
from pathlib import Path

import pytest


pytest.importorskip("agents.testing")
pytest.importorskip("agents.tracing")
pytest.importorskip("openinference.instrumentation.openai_agents")

from agents import Agent, RunConfig, Runner, function_tool, gen_trace_id, set_trace_processors, trace  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402

from relyscope.instrumentation import record_outcome  # noqa: E402
from relyscope.instrumentation.adapters.openai_agents import RelyscopeAgentsProcessor  # noqa: E402
from relyscope.testing import start_sidecar  # noqa: E402

SCRIPT = {"refund-42": ["lookup_order", "issue_refund"], "track-7": ["lookup_order", "track_parcel"]}
OUTCOMES = {"refund-42": [True, True, False, True, True], "track-7": [True, False, False, True, False]}


@function_tool
def lookup_order(order_id: int) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped"


@function_tool
def issue_refund(order_id: int) -> str:
    """Refund an order."""
    return "refunded"


@function_tool
def track_parcel(order_id: int) -> str:
    """Track a parcel."""
    return "in transit"


def _model(task: str) -> ScriptedModel:
    steps = [[function_call(tool, {"order_id": 42}, call_id=f"c{i}")] for i, tool in enumerate(SCRIPT[task])]
    return ScriptedModel([*steps, [assistant_message("done")]], emit_traces=True)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    sc = start_sidecar(tmp_path_factory.mktemp("oa"))
    instrumentor = OpenAIAgentsInstrumentor()
    try:
        tp = TracerProvider(resource=Resource.create({"service.name": "oa-svc"}))
        proc = RelyscopeAgentsProcessor()
        tp.add_span_processor(proc.span_processor)
        tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sc.otlp_http + "/v1/traces")))
        set_trace_processors([proc])
        instrumentor.instrument(tracer_provider=tp, exclusive_processor=False)
        posted = []
        for ok in OUTCOMES["refund-42"]:
            agent = Agent(name="support-oa", model=_model("refund-42"), tools=[lookup_order, issue_refund])
            with trace("support workflow", metadata={"relyscope.task.id": "refund-42"}) as t:
                assert Runner.run_sync(agent, "refund order 42").final_output == "done"
                assert proc.record(t.trace_id, success=ok, confidence=0.9 if ok else 0.4)
            assert proc.record(t.trace_id, success=ok) is False  # ended: post instead
        for ok in OUTCOMES["track-7"]:
            agent = Agent(name="support-oa", model=_model("track-7"), tools=[lookup_order, track_parcel])
            sdk_id = gen_trace_id()
            Runner.run_sync(agent, "where is my parcel", run_config=RunConfig(
                trace_id=sdk_id, trace_metadata={"relyscope.task.id": "track-7"}))
            otel_id = proc.otel_trace_id(sdk_id)
            assert otel_id is not None and len(otel_id) == 32
            posted.append((otel_id, ok))
        tp.shutdown()
        for otel_id, ok in posted:
            assert record_outcome(ok, trace_id=otel_id, api=sc.api)["key"] == otel_id
        sc.flush()
        yield sc.trials(agent="support-oa"), [g for g in sc.report()["groups"] if g["agent"] == "support-oa"]
    finally:
        instrumentor.uninstrument()
        set_trace_processors([])
        sc.kill()


def test_each_run_is_a_trial_with_agent_task_steps_outcome_and_confidence(scored):
    trials, _ = scored
    assert len(trials) == 10
    by_task = {}
    for t in sorted(trials, key=lambda t: t["start_ns"]):
        by_task.setdefault(t["task_id"], []).append(t)
    assert {k: len(v) for k, v in by_task.items()} == {"refund-42": 5, "track-7": 5}
    for task, ts in by_task.items():
        for t, ok in zip(ts, OUTCOMES[task]):
            tools = SCRIPT[task]
            assert t["agent_name"] == "support-oa" and t["task_id_source"] == "attribute"
            assert t["actions"] == ["llm", tools[0], "llm", tools[1], "llm"]
            assert t["outcome"] == ("success" if ok else "failure")
            if task == "refund-42":  # recorded on the open trace
                assert t["confidence"] == (0.9 if ok else 0.4)
            else:  # posted after the run: the outcome API carries no confidence
                assert t["confidence"] is None and t["outcome_source"] == "verifier_api"


def test_pass_hat_k_of_five_runs_of_two_tasks(scored):
    _, [g] = scored
    m = g["metrics"]
    for k in range(1, 6):  # C(c, k) / C(5, k) per task, c = 4 and 2, averaged over the two tasks
        assert m[f"pass^{k}"]["value"] == pytest.approx((comb(4, k) + comb(2, k)) / (2 * comb(5, k)), abs=1e-12)
    assert (m["pass^1"]["value"], m["pass^2"]["value"], m["pass^3"]["value"]) == pytest.approx((0.6, 0.35, 0.2))
