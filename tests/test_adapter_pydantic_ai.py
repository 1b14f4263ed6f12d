"""Issue 12: a pydantic-ai agent (the real package, its FunctionModel: no network) scored by a sidecar.

pydantic-ai's own ``Instrumentation`` capability emits the spans; relyscope's
:class:`RelyscopeCapability` adds task id, outcome and confidence to its agent-run span; the SDK's
OTLP/HTTP exporter sends them to a sidecar started here. Five runs of each of two tasks; the
outcomes are chosen per run and pass^k is worked out by hand below.
"""

from __future__ import annotations

from math import comb

import pytest

pytest.importorskip("pydantic_ai")

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from pydantic_ai import Agent, InstrumentationSettings  # noqa: E402
from pydantic_ai.capabilities import Instrumentation  # noqa: E402
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402

from relyscope.instrumentation.adapters.pydantic_ai import RelyscopeCapability  # noqa: E402
from relyscope.testing import start_sidecar  # noqa: E402

# task → the tools the scripted model calls, in order
SCRIPT = {"refund-42": ["lookup_order", "issue_refund"], "track-7": ["lookup_order", "track_parcel"]}
# five runs per task: refund-42 succeeds 4 of 5, track-7 2 of 5
OUTCOMES = {"refund-42": [True, True, False, True, True], "track-7": [True, False, False, True, False]}


def _model(task: str) -> FunctionModel:
    def respond(messages, info):
        done = sum(1 for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart))
        tools = SCRIPT[task]
        if done < len(tools):
            return ModelResponse(parts=[ToolCallPart(tools[done], {"order_id": 42}, tool_call_id=f"c{done}")])
        return ModelResponse(parts=[TextPart("done")])
    return FunctionModel(respond)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    sc = start_sidecar(tmp_path_factory.mktemp("pai"))
    try:
        tp = TracerProvider(resource=Resource.create({"service.name": "pai-svc"}))
        tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sc.otlp_http + "/v1/traces")))
        agent = Agent(name="support-pai",
                      capabilities=[Instrumentation(settings=InstrumentationSettings(tracer_provider=tp))])
        for tool in ("lookup_order", "issue_refund", "track_parcel"):
            agent.tool_plain(name=tool)(lambda order_id: f"ok {order_id}")
        for task, outcomes in OUTCOMES.items():
            for ok in outcomes:
                cap = RelyscopeCapability(task_id=task, outcome=lambda r, ok=ok: ok,
                                          confidence=lambda r, ok=ok: 0.9 if ok else 0.4)
                assert agent.run_sync(f"please handle {task}", model=_model(task), capabilities=[cap]).output == "done"
        tp.shutdown()
        sc.flush()
        yield sc.trials(agent="support-pai"), [g for g in sc.report()["groups"] if g["agent"] == "support-pai"]
    finally:
        sc.kill()


def test_each_run_is_a_trial_with_task_steps_outcome_and_confidence(scored):
    trials, _ = scored
    assert len(trials) == 10
    by_task = {}
    for t in sorted(trials, key=lambda t: t["start_ns"]):
        by_task.setdefault(t["task_id"], []).append(t)
    assert {k: len(v) for k, v in by_task.items()} == {"refund-42": 5, "track-7": 5}
    for task, ts in by_task.items():
        for t, ok in zip(ts, OUTCOMES[task]):
            assert t["agent_name"] == "support-pai" and t["task_id_source"] == "attribute"
            tools = SCRIPT[task]
            assert t["actions"] == ["llm", tools[0], "llm", tools[1], "llm"]
            assert t["outcome"] == ("success" if ok else "failure")
            assert t["confidence"] == (0.9 if ok else 0.4)
            assert t["status"] == "complete"


def test_pass_hat_k_of_five_runs_of_two_tasks(scored):
    _, [g] = scored
    m = g["metrics"]
    # pass^k per task = C(c, k) / C(5, k); refund-42 c = 4, track-7 c = 2; the group mean of both
    for k in range(1, 6):
        want = (comb(4, k) + comb(2, k)) / (2 * comb(5, k))
        assert m[f"pass^{k}"]["value"] == pytest.approx(want, abs=1e-12), k
        assert m[f"pass^{k}"]["n_tasks"] == 2
    # written out: pass^1 = (4/5 + 2/5)/2 = 0.6, pass^2 = (6/10 + 1/10)/2 = 0.35, pass^3 = (4/10 + 0)/2 = 0.2
    assert (m["pass^1"]["value"], m["pass^2"]["value"], m["pass^3"]["value"]) == pytest.approx((0.6, 0.35, 0.2))
    assert g["tasks"] == 2 and g["trials"] == 10


def test_a_failing_verifier_or_a_bad_confidence_never_costs_the_run_its_result():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai.models.test import TestModel

    exp = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exp))
    agent = Agent(TestModel(custom_output_text="fine"), name="p",
                  capabilities=[Instrumentation(settings=InstrumentationSettings(tracer_provider=tp))])

    def broken(result):
        raise RuntimeError("verifier bug")

    out = agent.run_sync("hi", capabilities=[RelyscopeCapability(task_id="t", outcome=broken,
                                                                 confidence=lambda r: 1.5)])
    assert out.output == "fine"
    [root] = [s for s in exp.get_finished_spans() if s.name == "invoke_agent p"]
    assert root.attributes["relyscope.task.id"] == "t"
    assert "relyscope.outcome" not in root.attributes and "relyscope.confidence" not in root.attributes
