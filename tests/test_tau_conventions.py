"""The τ-bench gpt-4o airline import, re-expressed in OpenInference and OpenLLMetry conventions, scores
the same as in GenAI semconv: published pass^1..4 and identical action sequences per trial.

The importer (relyscope.importers.tau_bench) emits GenAI-semconv spans through the OTel SDK; they are
encoded to OTLP/JSON and decoded by the collector's decoder. Two small converters below rewrite each
span the way the other instrumentations would have emitted it (conventions.md §3):

- OpenInference: ``openinference.span.kind`` AGENT / LLM / TOOL, ``agent.name``, ``llm.model_name``,
  ``llm.output_messages.0.message.tool_calls.{j}.tool_call.*``, ``tool.name``, ``tool_call.id``,
  ``input.value`` / ``output.value``, ``session.id``;
- OpenLLMetry: ``traceloop.span.kind`` agent / tool, ``traceloop.entity.name``,
  ``traceloop.entity.input`` as ``{"args": [], "kwargs": {…}}``, model calls with
  ``llm.request.type=chat`` and flattened ``gen_ai.completion.0.*`` (tool calls by id; its tool spans
  carry no call id), ``traceloop.association.properties.session_id``.

``relyscope.task.id`` / ``relyscope.trial.id`` / ``relyscope.outcome*`` / ``relyscope.run.kind`` stay
on the root. Spans are fed to the builder in converted form, in reverse order (children first).
Published figures (shared/data/README.md): pass^1..4 = 0.420, 0.2733, 0.220, 0.200.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conftest import TAU_FILE
from relyscope.collector.normalize import normalize
from relyscope.collector.otlp import decode_json
from relyscope.importers.tau_bench import replay_tau_bench
from relyscope.instrumentation.otlp_json import encode_otlp_json
from relyscope.model import CanonicalSpan
from relyscope.scorers.profile import score_group
from relyscope.trajectory import TrajectoryBuilder

PUBLISHED = {"pass^1": 0.420, "pass^2": 0.2733, "pass^3": 0.220, "pass^4": 0.200}
RESOURCE = {"service.name": "tau-bench-airline", "service.version": "gpt-4o"}


@pytest.fixture(scope="module")
def genai_spans() -> list[CanonicalSpan]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    replay_tau_bench(TAU_FILE, tracer_provider=tp)
    finished = exporter.get_finished_spans()
    tp.shutdown()
    res = decode_json(json.dumps(encode_otlp_json(finished)).encode())
    assert res.rejected == 0
    return res.spans


def _rs_attrs(a) -> dict:
    return {k: v for k, v in a.items() if k.startswith("relyscope.")}


def _calls(a) -> list[dict]:
    """Tool calls the GenAI model span requested (from gen_ai.output.messages)."""
    msgs = json.loads(a.get("gen_ai.output.messages", "[]"))
    return [p for m in msgs for p in m.get("parts", ()) if p.get("type") == "tool_call"]


def _decoded(s):
    try:
        return json.loads(s) if isinstance(s, str) else s
    except json.JSONDecodeError:
        return s


def to_openinference(span: CanonicalSpan) -> CanonicalSpan:
    a = span.attributes
    op = a["gen_ai.operation.name"]
    if op == "invoke_agent":
        name = a["gen_ai.agent.name"]
        attrs = {"openinference.span.kind": "AGENT", "agent.name": name,
                 "session.id": f"tau-{a['relyscope.trial.id']}", **_rs_attrs(a)}
    elif op == "chat":
        name = "ChatCompletion"
        attrs = {"openinference.span.kind": "LLM", "llm.model_name": a["gen_ai.request.model"],
                 "llm.provider": "openai", "llm.output_messages.0.message.role": "assistant"}
        for j, c in enumerate(_calls(a)):
            base = f"llm.output_messages.0.message.tool_calls.{j}.tool_call"
            attrs[f"{base}.id"] = c["id"]
            attrs[f"{base}.function.name"] = c["name"]
            attrs[f"{base}.function.arguments"] = json.dumps(c["arguments"])
    elif op == "execute_tool":
        name = a["gen_ai.tool.name"]
        attrs = {"openinference.span.kind": "TOOL", "tool.name": name,
                 "tool_call.id": a["gen_ai.tool.call.id"], "input.value": a["gen_ai.tool.call.arguments"]}
        if "gen_ai.tool.call.result" in a:
            attrs["output.value"] = a["gen_ai.tool.call.result"]
    else:
        raise AssertionError(op)
    return dataclasses.replace(span, name=name, attributes=attrs, resource=RESOURCE,
                               scope_name="openinference.instrumentation.openai", scope_version="0.1")


def to_openllmetry(span: CanonicalSpan) -> CanonicalSpan:
    a = span.attributes
    op = a["gen_ai.operation.name"]
    if op == "invoke_agent":
        name = f"{a['gen_ai.agent.name']}.agent"
        attrs = {"traceloop.span.kind": "agent", "traceloop.entity.name": a["gen_ai.agent.name"],
                 "traceloop.association.properties.session_id": f"tau-{a['relyscope.trial.id']}",
                 **_rs_attrs(a)}
    elif op == "chat":
        name = "openai.chat"
        attrs = {"llm.request.type": "chat", "gen_ai.system": "openai",
                 "gen_ai.request.model": a["gen_ai.request.model"], "gen_ai.response.model": a["gen_ai.response.model"],
                 "gen_ai.completion.0.role": "assistant",
                 "gen_ai.completion.0.finish_reason": a["gen_ai.response.finish_reasons"][0]}
        for j, c in enumerate(_calls(a)):
            base = f"gen_ai.completion.0.tool_calls.{j}"
            attrs.update({f"{base}.id": c["id"], f"{base}.name": c["name"],
                          f"{base}.arguments": json.dumps(c["arguments"])})
    elif op == "execute_tool":
        name = f"{a['gen_ai.tool.name']}.tool"
        attrs = {"traceloop.span.kind": "tool", "traceloop.entity.name": a["gen_ai.tool.name"],
                 "traceloop.entity.input": json.dumps(
                     {"args": [], "kwargs": _decoded(a["gen_ai.tool.call.arguments"])})}
        if "gen_ai.tool.call.result" in a:
            attrs["traceloop.entity.output"] = json.dumps(a["gen_ai.tool.call.result"])
    else:
        raise AssertionError(op)
    return dataclasses.replace(span, name=name, attributes=attrs, resource=RESOURCE,
                               scope_name="opentelemetry.instrumentation.openai.v1", scope_version="0.33.9")


def _trials(spans: list[CanonicalSpan], *, reverse: bool):
    b = TrajectoryBuilder(grace_s=5, root_timeout_s=300)
    items = [(s, normalize(s)) for s in (reversed(spans) if reverse else spans)]
    for k in range(0, len(items), 500):  # batches, the clock advancing less than the grace period
        b.add(items[k:k + 500], now=k / 1000)
    trials = b.poll(len(items) / 1000 + 5)
    assert b.open_traces == 0
    return {t.trial_id: t for t in trials}


@pytest.fixture(scope="module")
def by_convention(genai_spans):
    return {
        "genai": _trials(genai_spans, reverse=False),
        "openinference": _trials([to_openinference(s) for s in genai_spans], reverse=True),
        "openllmetry": _trials([to_openllmetry(s) for s in genai_spans], reverse=True),
    }


def test_converters_produce_the_intended_conventions(genai_spans):
    seen = {}
    for conv, f in (("openinference", to_openinference), ("openllmetry", to_openllmetry)):
        for s in genai_spans[:60]:
            sem = normalize(f(s))
            seen.setdefault(conv, set()).add((sem.op.value, sem.convention))
    assert seen["openinference"] == {("agent", "openinference"), ("llm", "openinference"),
                                     ("tool", "openinference")}
    assert {op for op, _ in seen["openllmetry"]} == {"agent", "llm", "tool"}
    assert {c for _, c in seen["openllmetry"]} == {"openllmetry"}


def _expected_actions() -> dict[str, tuple[str, ...]]:
    """From the raw τ-bench file: per assistant message "llm", then each requested tool's name."""
    out = {}
    for rec in json.loads(TAU_FILE.read_text()):
        acts: list[str] = []
        for m in rec["traj"]:
            if m.get("role") == "assistant":
                acts.append("llm")
                acts += [c["function"]["name"] for c in m.get("tool_calls") or ()]
        out[f"{rec['task_id']}:{rec['trial']}"] = tuple(acts)
    return out


@pytest.mark.parametrize("conv", ["genai", "openinference", "openllmetry"])
def test_published_pass_hat_k_and_same_trajectories(by_convention, conv):
    trials = by_convention[conv]
    assert len(trials) == 200
    assert {t.agent_name for t in trials.values()} == {"tau-bench-airline"}
    assert {t.agent_version for t in trials.values()} == {"gpt-4o"}
    assert {(t.status, t.run_kind, t.task_id_source) for t in trials.values()} == {
        ("complete", "offline", "attribute")}
    assert not any("missing_tool_span" in t.flags or "reattached" in t.flags for t in trials.values())
    # action sequences: from the raw file, and identical to the GenAI-semconv assembly
    assert {k: t.actions for k, t in trials.items()} == _expected_actions()
    ref = by_convention["genai"]
    for k, t in trials.items():
        assert [(s.action, s.arguments) for s in t.steps] == [(s.action, s.arguments) for s in ref[k].steps], k
        assert (t.outcome, t.task_id, t.model_calls, t.tool_calls) == (
            ref[k].outcome, ref[k].task_id, ref[k].model_calls, ref[k].tool_calls)
    gs = score_group(list(trials.values()), n_boot=0)
    assert gs.tasks == 50 and gs.trials == 200
    for k, v in PUBLISHED.items():
        assert gs.metrics[k].value == pytest.approx(v, abs=5e-4), k
