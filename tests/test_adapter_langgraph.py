"""Issue 12: a LangGraph agent (the real packages, langchain-core's GenericFakeChatModel: no network)
scored by a sidecar.

OpenInference's LangChain instrumentation emits the spans; relyscope's callback handler takes the
task id from the run-config metadata and sets it, the graph's name, the outcome and the confidence
(functions of the run's final state) on OpenInference's root span. OTLP/HTTP to a sidecar started
here. Five runs of each of two tasks, outcomes chosen per run; pass^k worked out by hand.
"""

from __future__ import annotations

import uuid
import warnings
from math import comb

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("openinference.instrumentation.langchain")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from openinference.instrumentation.langchain import LangChainInstrumentor  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402

from relyscope.instrumentation import record_outcome  # noqa: E402
from relyscope.instrumentation.adapters.langchain import RelyscopeCallbackHandler  # noqa: E402
from relyscope.testing import start_sidecar  # noqa: E402

with warnings.catch_warnings():  # create_react_agent moved to langchain.agents (another package)
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent  # noqa: E402

SCRIPT = {"refund-42": ["lookup_order", "issue_refund"], "track-7": ["lookup_order", "track_parcel"]}
OUTCOMES = {"refund-42": [True, True, False, True, True], "track-7": [True, False, False, True, False]}


@tool
def lookup_order(order_id: int) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped"


@tool
def issue_refund(order_id: int) -> str:
    """Refund an order."""
    return "refunded"


@tool
def track_parcel(order_id: int) -> str:
    """Track a parcel."""
    return "in transit"


class _FakeToolModel(GenericFakeChatModel):
    """GenericFakeChatModel answering from its scripted messages; tools are bound by the agent,
    and a scripted message names the tool calls itself."""

    def bind_tools(self, tools, **kwargs):
        return self


def _agent(task: str, ok: bool):
    msgs = [AIMessage(content="", tool_calls=[{"name": t, "args": {"order_id": 42}, "id": f"c{i}"}])
            for i, t in enumerate(SCRIPT[task])]
    msgs.append(AIMessage(content="resolved" if ok else "could not"))
    tools = {"lookup_order": lookup_order, "issue_refund": issue_refund, "track_parcel": track_parcel}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(_FakeToolModel(messages=iter(msgs)), [tools[t] for t in SCRIPT[task]],
                                  name="support-lg")


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    sc = start_sidecar(tmp_path_factory.mktemp("lg"))
    instrumentor = LangChainInstrumentor()
    try:
        tp = TracerProvider(resource=Resource.create({"service.name": "lg-svc"}))
        tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sc.otlp_http + "/v1/traces")))
        instrumentor.instrument(tracer_provider=tp)
        # the application's verifier reads the graph's final state
        handler = RelyscopeCallbackHandler(outcome=lambda out: out["messages"][-1].content == "resolved",
                                           confidence=lambda out: 0.9 if out["messages"][-1].content == "resolved"
                                           else 0.4)
        run_ids = []
        for task, outcomes in OUTCOMES.items():
            for ok in outcomes:
                rid = uuid.uuid4()
                out = _agent(task, ok).invoke({"messages": [("user", f"please handle {task}")]}, config={
                    "callbacks": [handler], "run_id": rid, "metadata": {"relyscope.task.id": task}})
                assert out["messages"][-1].content == ("resolved" if ok else "could not")
                run_ids.append(rid)
        tp.shutdown()
        trace_ids = [handler.trace_id_of(r) for r in run_ids]
        assert all(t is not None and len(t) == 32 for t in trace_ids) and len(set(trace_ids)) == 10
        assert handler.last_trace_id == trace_ids[-1]
        sc.flush()
        yield sc, trace_ids
    finally:
        instrumentor.uninstrument()
        sc.kill()


def _group(sc):
    return [g for g in sc.report()["groups"] if g["agent"] == "support-lg"]


def test_each_run_is_a_trial_with_agent_task_steps_outcome_and_confidence(scored):
    sc, trace_ids = scored
    trials = {t["trace_id"]: t for t in sc.trials(agent="support-lg")}
    assert set(trials) == set(trace_ids)
    runs = [(task, ok) for task, outcomes in OUTCOMES.items() for ok in outcomes]
    for tid, (task, ok) in zip(trace_ids, runs):
        t = trials[tid]
        tools = SCRIPT[task]
        assert (t["task_id"], t["task_id_source"]) == (task, "attribute")
        assert t["actions"] == ["llm", tools[0], "llm", tools[1], "llm"]
        assert t["outcome"] == ("success" if ok else "failure")
        assert t["confidence"] == (0.9 if ok else 0.4)


def test_pass_hat_k_of_five_runs_of_two_tasks_and_a_late_verifier_post(scored):
    sc, trace_ids = scored
    [g] = _group(sc)
    m = g["metrics"]
    for k in range(1, 6):  # C(c, k) / C(5, k) per task, c = 4 and 2, averaged over the two tasks
        assert m[f"pass^{k}"]["value"] == pytest.approx((comb(4, k) + comb(2, k)) / (2 * comb(5, k)), abs=1e-12)
    # the third refund-42 run is found to have succeeded after all (the application's own check,
    # posted by trace id): refund-42 5/5, track-7 2/5 → pass^2 = (1 + 1/10)/2 = 0.55
    reply = record_outcome(True, trace_id=trace_ids[2], api=sc.api)
    assert reply["status"] == "recorded"
    [g] = _group(sc)
    assert g["metrics"]["pass^1"]["value"] == pytest.approx((1 + 0.4) / 2)
    assert g["metrics"]["pass^2"]["value"] == pytest.approx(0.55)
