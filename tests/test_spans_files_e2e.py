"""Every recorded emitter file of /work/shared/data/spans/ over OTLP/HTTP (JSON) to a real sidecar.

Expectations were written by reading each file (see the table in its README): the agent runs, tool
calls (names, decoded arguments and results), model calls and token totals a person would list.

None of the files holds an agent root span. Rule (documented in relyscope.trajectory.builder): a
trace with model, tool or handoff spans but no agent/workflow root still forms a trial — status
``incomplete``, flag ``missing_root``, under a virtual root spanning min(start)..max(end) — so model
and tool calls are never silently lost, and it never enters success metrics. A trace with no
model/tool span at all (``string-encoded-int-resource-attributes``: one attribute-less span) forms
no trial; its span is still stored.

Several files reuse the same trace id (openlit / semantic-kernel / string-encoded share trace and
span ids; google-adk / pydantic-ai share a trace id), so files whose trace ids collide go to
different sidecars (a small pool, one sidecar per non-colliding group).
"""

from __future__ import annotations

import hashlib
import time

import httpx
import pytest

from conftest import DATA, start_sidecar

SPANS = DATA / "spans"


def fp(text: str) -> str:
    """metrics.md §1 task fingerprint, computed here independently."""
    return hashlib.sha256(" ".join(text.split()).lower().encode()).hexdigest()


# file -> expected (read from the file). steps: (action, depth, arguments, result); tokens: in/out/total
# (None: the file reports no token counts, so they are unknown, not 0)
EXPECT = {
    "genkit-generation.otlp.json": dict(
        trace="0b16212c37424d58636e79848f9aa5b0", spans=1, agent="unknown_service",
        steps=[("llm", 1, None, None)], models=["gpt-5-mini"], tokens=(1618, 337, 1955), cost=None,
        task=fp("Output should be in JSON format."), conversation=None,
        interval=(1738074845669299666, 1738074846843448248)),
    "google-adk-tool-call.otlp.json": dict(
        trace="abcdef1234567890abcdef1234567890", spans=1, agent="unknown_service",
        steps=[("bake_cake", 1, {"query": "much duplo"}, {"result": "particularly juicy cake"})],
        call_ids=["adk-chocolate-caked"], models=[], tokens=(None, None, None), cost=None, task=None,
        conversation="test-session-333bff8e", interval=(1746664780418532160, 1746664780966191160)),
    "langfuse-sdk-generation.otlp.json": dict(
        # my-span (a plain span, parentless) wraps my-generation (gpt-4o, 123 in / 456 out tokens,
        # cost 0.0001 + 0.002 USD)
        trace="2cce18f7e8cd065a0b4e634eef728391", spans=2, agent="unknown_service",
        steps=[("llm", 2, None, None)], models=["gpt-4o"], tokens=(123, 456, 579), cost=0.0021,
        task=fp("hello"), conversation="my-session",
        interval=(1746026930424929000, 1746026930687124000)),
    "openlit-openai-chat.otlp.json": dict(
        trace="ea673708441c2984a54a3e3962d3595f", spans=1, agent="default",
        steps=[("llm", 1, None, None)], models=["gpt-3.5-turbo"], tokens=(14, 96, 110), cost=0.000151,
        task=fp("What is LLM Observability?"), conversation=None,
        interval=(1738074845669299666, 1738074846843448248)),
    "openllmetry-openai-chat.otlp.json": dict(
        trace="e4ef45025c9b40924bff175e2b125b5b", spans=1,
        agent="/usr/local/lib/python3.11/dist-packages/colab_kernel_launcher.py",
        steps=[("llm", 1, None, None)], models=["gpt-3.5-turbo-0125"], tokens=(14, 173, 187), cost=None,
        task=fp("What is LLM Observability?"), conversation=None,
        interval=(1738144119909093908, 1738144121353287966)),
    "pydantic-ai-tool-call.otlp.json": dict(
        trace="abcdef1234567890abcdef1234567890", spans=1, agent="unknown",
        steps=[("roulette_wheel", 1, {"square": 18}, "winner")], call_ids=["call_idvalue"], models=[],
        tokens=(None, None, None), cost=None, task=None, conversation=None,
        interval=(1746026930220515904, 1746026930221515904)),
    "semantic-kernel-1.55-chat-events.otlp.json": dict(
        trace="ea673708441c2984a54a3e3962d3595f", spans=1, agent="unknown",
        steps=[("llm", 1, None, None)], models=["gpt-4-0613"], tokens=(None, None, None), cost=None,
        task=fp("What is the capital of France?"), conversation=None,
        interval=(1738074845669299666, 1738074846843448248)),
    "string-encoded-int-resource-attributes.otlp.json": dict(
        trace="ea673708441c2984a54a3e3962d3595f", spans=1, steps=None),
    "vercel-ai-sdk-v7-genai-semconv.otlp.json": dict(
        # chat test-model, and execute_tool get_weather as its child
        trace="abcdef1234567890abcdef1234567894", spans=2, agent="otel-test-service",
        steps=[("llm", 1, None, None), ("get_weather", 2, {"location": "Berlin"}, {"temperature": 21})],
        models=["test-model"], tokens=(None, None, None), cost=None, task=fp("hello"), conversation=None,
        interval=(1746026930219515904, 1746026930221515904)),
}


def test_every_file_has_an_expectation():
    assert sorted(p.name for p in SPANS.glob("*.otlp.json")) == sorted(EXPECT)


@pytest.fixture(scope="module")
def sidecar_pool(tmp_path_factory):
    pool: list[tuple[object, set[str]]] = []

    def get(trace_ids: set[str]):
        for sc, used in pool:
            if not (used & trace_ids):
                used |= trace_ids
                return sc
        sc = start_sidecar(tmp_path_factory.mktemp("sidecar"))
        pool.append((sc, set(trace_ids)))
        return sc

    yield get
    for sc, _ in pool:
        sc.kill()
        for f in (sc.proc.stdout, sc.proc.stderr):
            if f:
                f.close()


def _wait(pred, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_file_over_otlp_http(sidecar_pool, name):
    exp = EXPECT[name]
    body = (SPANS / name).read_bytes()
    sc = sidecar_pool({exp["trace"]})
    r = httpx.post(f"{sc.otlp_http}/v1/traces", content=body, headers={"Content-Type": "application/json"},
                   timeout=30)
    assert r.status_code == 200, r.text
    assert not r.json().get("partialSuccess", {}).get("rejectedSpans")
    _wait(lambda: len(sc.get("/api/v1/spans", params={"trace_id": exp["trace"]}).json()["keys"]) == exp["spans"],
          f"{name}: spans stored")
    sc.flush()
    trials = [t for t in sc.trials() if t["trace_id"] == exp["trace"]]
    if exp["steps"] is None:
        assert trials == []  # nothing an agent did: stored, not a trial
        return
    assert len(trials) == 1, trials
    t = trials[0]
    assert t["status"] == "incomplete" and t["flags"] == ["missing_root"]
    assert t["trial_id"] == f"{exp['trace']}:virtual" and t["agent_name"] == exp["agent"]
    assert [(s["action"], s["depth"], s["arguments"], s["result"]) for s in t["steps"]] == exp["steps"]
    assert [s["model"] for s in t["steps"] if s["op"] == "llm"] == exp["models"]
    if "call_ids" in exp:
        assert [s["tool_call_id"] for s in t["steps"] if s["op"] == "tool"] == exp["call_ids"]
    assert t["model_calls"] == len(exp["models"])
    assert t["tool_calls"] == sum(1 for s in exp["steps"] if s[0] != "llm")
    assert (t["input_tokens"], t["output_tokens"], t["total_tokens"]) == exp["tokens"]
    if exp["cost"] is None:
        assert t["cost_usd"] is None
    else:
        assert t["cost_usd"] == pytest.approx(exp["cost"], rel=1e-9)
    if exp["task"] is None:
        assert (t["task_id"], t["task_id_source"]) == (exp["trace"], "trace")
    else:
        assert (t["task_id"], t["task_id_source"]) == (exp["task"], "fingerprint")
    assert t["conversation_id"] == exp["conversation"]
    # virtual root = min(start)..max(end); the trials table keeps microseconds (DateTime64(6))
    assert (t["start_ns"] // 1000, t["end_ns"] // 1000) == tuple(x // 1000 for x in exp["interval"])
    # never mixed into success metrics
    groups = [g for g in sc.report()["groups"] if g["agent"] == exp["agent"]]
    assert groups and groups[0]["metrics"]["pass^1"]["value"] is None
