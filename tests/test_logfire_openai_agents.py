"""OpenAI Agents SDK traces as Logfire exports them (``logfire.instrument_openai_agents()``), over
real OTLP/HTTP to a sidecar: root, ordered steps, tool errors, handoffs, guardrail trips, tokens
and agent name of each trial.

The spans are the inline snapshots of pydantic/logfire ``tests/otel_integrations/
test_openai_agents.py`` (``test_responses``, ``test_function_tool_exception``,
``test_input_guardrails``), copied with their names, parent links, times and attributes (the
``code.*`` attributes left out). Logfire's span *name* is the message template and there is no
``type`` attribute; dict/list attributes are exported as JSON strings, as Logfire does. Two spans
the snapshot elides with ``IsInt()``/``IsStr()`` get concrete values here.
"""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import start_sidecar

S = 10**9  # the snapshots' clock: one second per tick


def _value(v):
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    return {"stringValue": json.dumps(v)}  # Logfire: JSON-encoded attribute + logfire.json_schema


def _otlp(snapshot: list[dict], trace_hex: str) -> dict:
    """Logfire test-exporter spans (exported_spans_as_dict) → one OTLP/JSON request."""
    spans = []
    for sp in snapshot:
        out = {
            "traceId": trace_hex, "spanId": f"{sp['context']['span_id']:016x}",
            "name": sp["name"], "kind": 1,
            "startTimeUnixNano": str(sp["start_time"]), "endTimeUnixNano": str(sp["end_time"]),
            "attributes": [{"key": k, "value": _value(v)} for k, v in sp["attributes"].items()],
        }
        if sp.get("parent"):
            out["parentSpanId"] = f"{sp['parent']['span_id']:016x}"
        if sp.get("events"):
            out["events"] = [{"name": e["name"], "timeUnixNano": str(e["timestamp"]),
                              "attributes": [{"key": k, "value": _value(v)} for k, v in e["attributes"].items()]}
                             for e in sp["events"]]
        spans.append(out)
    return {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "agents-app"}}]},
        "scopeSpans": [{"scope": {"name": "logfire.openai_agents"}, "spans": spans}]}]}


def _ctx(i):
    return {"trace_id": 1, "span_id": i, "is_remote": False}


def _workflow(root_end: int, task_end: int, usage: dict) -> list[dict]:
    return [
        {"name": "Task: Agent workflow", "context": _ctx(3), "parent": _ctx(1), "start_time": 2 * S,
         "end_time": task_end, "attributes": {
             "logfire.msg_template": "Task: Agent workflow", "logfire.span_type": "span", "type": "custom",
             "name": "Agent workflow", "sdk_span_type": "task", "usage": usage, "gen_ai.system": "openai",
             "logfire.msg": "Task: Agent workflow"}},
        {"name": "OpenAI Agents trace: {name}", "context": _ctx(1), "parent": None, "start_time": 1 * S,
         "end_time": root_end, "attributes": {
             "name": "Agent workflow", "group_id": "null", "metadata": "null", "tracing": "null",
             "logfire.msg_template": "OpenAI Agents trace: {name}",
             "logfire.msg": "OpenAI Agents trace: Agent workflow", "logfire.span_type": "span",
             "agent_trace_id": "trace_0123456789abcdef0123456789abcdef"}},
    ]


def _agent_run(sid, name, start, end, handoffs=(), tools=()):
    return {"name": "Agent run: {name!r}", "context": _ctx(sid), "parent": _ctx(3), "start_time": start,
            "end_time": end, "attributes": {
                "logfire.msg_template": "Agent run: {name!r}", "logfire.span_type": "span", "name": name,
                "handoffs": list(handoffs), "tools": list(tools), "output_type": "str",
                "logfire.msg": f"Agent run: {name!r}", "gen_ai.system": "openai"}}


def _turn(sid, parent, agent, turn, start, end, usage, error=None):
    a = {"logfire.msg_template": f"Turn {{turn}} for agent {agent}", "logfire.span_type": "span",
         "type": "custom", "logfire.msg": f"Turn {turn} for agent {agent}", "sdk_span_type": "turn",
         "turn": turn, "agent_name": agent, "usage": usage, "name": "turn", "gen_ai.system": "openai"}
    if error:
        a["error"] = error
    return {"name": f"Turn {{turn}} for agent {agent}", "context": _ctx(sid), "parent": _ctx(parent),
            "start_time": start, "end_time": end, "attributes": a}


def _responses(sid, parent, start, end, usage, events, in_out=None, raw_input=()):
    a = {"logfire.msg_template": "Responses API with {gen_ai.request.model!r}", "logfire.span_type": "span",
         "logfire.msg": "Responses API with 'gpt-4o'", "response_id": f"resp_{sid}", "usage": usage,
         "gen_ai.request.model": "gpt-4o", "gen_ai.response.model": "gpt-4o-2024-08-06",
         "gen_ai.system": "openai", "gen_ai.operation.name": "chat", "raw_input": list(raw_input),
         "events": events}
    if in_out:
        a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"] = in_out
    return {"name": "Responses API with {gen_ai.request.model!r}", "context": _ctx(sid), "parent": _ctx(parent),
            "start_time": start, "end_time": end, "attributes": a}


def _call(cid, name):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


USER = "Generate a random number then, hand off to agent2."
CALL_RN, CALL_TR = "call_vwqy7HyGGnNht9NNfxMnnouY", "call_oEA0MnUXCwKevx8txteoopNL"
ZERO_USAGE = {"requests": 1, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
              "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 0},
              "output_tokens_details": {"reasoning_tokens": 0}}

#: test_responses: agent1 calls random_number, hands off to agent2, which answers.
RESPONSES = [
    _responses(9, 7, 5 * S, 6 * S, ZERO_USAGE, [
        {"event.name": "gen_ai.user.message", "content": USER, "role": "user"},
        {"event.name": "gen_ai.assistant.message", "role": "assistant", "tool_calls": [_call(CALL_RN, "random_number")]},
        {"event.name": "gen_ai.assistant.message", "role": "assistant", "tool_calls": [_call(CALL_TR, "transfer_to_agent2")]},
    ], raw_input=[{"content": USER, "role": "user"}]),
    {"name": "Function: {name}", "context": _ctx(11), "parent": _ctx(7), "start_time": 7 * S, "end_time": 8 * S,
     "attributes": {"logfire.msg_template": "Function: {name}", "logfire.span_type": "span",
                    "logfire.msg": "Function: random_number", "name": "random_number", "input": {},
                    "mcp_data": "null", "gen_ai.system": "openai", "output": 4}},
    {"name": "Handoff: {from_agent} → {to_agent}", "context": _ctx(13), "parent": _ctx(7), "start_time": 9 * S,
     "end_time": 10 * S, "attributes": {"logfire.msg_template": "Handoff: {from_agent} → {to_agent}",
                                         "logfire.span_type": "span", "logfire.msg": "Handoff: agent1 → agent2",
                                         "from_agent": "agent1", "gen_ai.system": "openai", "to_agent": "agent2"}},
    _turn(7, 5, "agent1", 1, 4 * S, 11 * S, {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0,
                                             "cache_write_input_tokens": 0}),
    _agent_run(5, "agent1", 3 * S, 12 * S, handoffs=["agent2"], tools=["random_number"]),
    _responses(19, 17, 15 * S, 16 * S, {**ZERO_USAGE, "input_tokens": 89, "output_tokens": 18, "total_tokens": 107}, [
        {"event.name": "gen_ai.system.message", "content": "Return double the number", "role": "system"},
        {"event.name": "gen_ai.user.message", "content": USER, "role": "user"},
        {"event.name": "gen_ai.assistant.message", "role": "assistant", "tool_calls": [_call(CALL_RN, "random_number")]},
        {"event.name": "gen_ai.assistant.message", "role": "assistant", "tool_calls": [_call(CALL_TR, "transfer_to_agent2")]},
        {"event.name": "gen_ai.tool.message", "role": "tool", "id": CALL_RN, "content": "4", "name": "random_number"},
        {"event.name": "gen_ai.tool.message", "role": "tool", "id": CALL_TR, "content": '{"assistant": "agent2"}',
         "name": "transfer_to_agent2"},
        {"event.name": "gen_ai.assistant.message", "role": "assistant",
         "content": "The random number generated is 4, and it's been handed off to agent2."},
    ], in_out=(89, 18)),
    _turn(17, 15, "agent2", 2, 14 * S, 17 * S, {"input_tokens": 89, "output_tokens": 18, "cached_input_tokens": 0,
                                                "cache_write_input_tokens": 0}),
    _agent_run(15, "agent2", 13 * S, 18 * S),
    *_workflow(20 * S, 19 * S, {"input_tokens": 89, "output_tokens": 18, "requests": 2, "total_tokens": 107}),
]

CALL_T = "call_OpJ32C09GImFzxYLe01MiOOd"
TOOL_OUT = "An error occurred while running the tool. Please try again. Error: Ouch, don't do that again!"
#: test_function_tool_exception: the tool raises; the model is told and answers.
TOOL_EXCEPTION = [
    _responses(9, 7, 5 * S, 6 * S, {**ZERO_USAGE, "input_tokens": 244, "output_tokens": 10, "total_tokens": 254}, [
        {"event.name": "gen_ai.user.message", "content": "Call the tool.", "role": "user"},
        {"event.name": "gen_ai.assistant.message", "role": "assistant", "tool_calls": [_call(CALL_T, "tool")]},
    ], in_out=(244, 10), raw_input=[{"content": "Call the tool.", "role": "user"}]),
    {"name": "Function: {name}", "context": _ctx(11), "parent": _ctx(7), "start_time": 7 * S, "end_time": 9 * S,
     "attributes": {"logfire.msg_template": "Function: {name}", "logfire.span_type": "span", "logfire.level_num": 17,
                    "name": "tool", "input": {}, "output": TOOL_OUT, "mcp_data": "null", "gen_ai.system": "openai",
                    "error": {"message": "Error running tool (non-fatal)",
                              "data": {"tool_name": "tool", "error": "Ouch, don't do that again!"}},
                    "logfire.msg": "Function: tool failed: Error running tool (non-fatal)"},
     "events": [{"name": "exception", "timestamp": 8 * S, "attributes": {
         "exception.type": "RuntimeError", "exception.message": "Ouch, don't do that again!",
         "exception.stacktrace": "RuntimeError: Ouch, don't do that again!", "exception.escaped": "False"}}]},
    _turn(7, 5, "Start Agent", 1, 4 * S, 10 * S, {"input_tokens": 244, "output_tokens": 10}),
    _responses(15, 13, 12 * S, 13 * S, {**ZERO_USAGE, "input_tokens": 283, "output_tokens": 26, "total_tokens": 309}, [
        {"event.name": "gen_ai.user.message", "content": "Call the tool.", "role": "user"},
        {"event.name": "gen_ai.assistant.message", "role": "assistant", "tool_calls": [_call(CALL_T, "tool")]},
        {"event.name": "gen_ai.tool.message", "role": "tool", "id": CALL_T, "content": TOOL_OUT, "name": "tool"},
        {"event.name": "gen_ai.assistant.message", "role": "assistant",
         "content": "It seems there was an error when trying to call the tool."},
    ], in_out=(283, 26)),
    _turn(13, 5, "Start Agent", 2, 11 * S, 14 * S, {"input_tokens": 527, "output_tokens": 36}),
    _agent_run(5, "Start Agent", 3 * S, 15 * S, tools=["tool"]),
    *_workflow(17 * S, 16 * S, {"input_tokens": 527, "output_tokens": 36, "requests": 2}),
]

#: test_input_guardrails, second run: the guardrail trips (the model call is left out, as the
#: snapshot does: it races the guardrail); end times the snapshot elides are filled in.
GUARDRAIL_TRIP = [
    {"name": "Guardrail {name!r} {triggered=}", "context": _ctx(21), "parent": _ctx(19), "start_time": 17 * S,
     "end_time": 18 * S, "attributes": {"triggered": True, "gen_ai.system": "openai", "name": "zero_guardrail",
                                         "logfire.msg_template": "Guardrail {name!r} {triggered=}",
                                         "logfire.msg": "Guardrail 'zero_guardrail' triggered=True",
                                         "logfire.span_type": "span"}},
    _turn(19, 17, "my_agent", 1, 16 * S, 19 * S, {}, error={"message": "Guardrail tripwire triggered",
                                                           "data": {"guardrail": "zero_guardrail"}}),
    {**_agent_run(17, "my_agent", 15 * S, 20 * S), "parent": _ctx(3)},
    *[{**w, "start_time": w["start_time"] + 12 * S} for w in _workflow(22 * S, 21 * S, {})],
]

TRACES = {"responses": ("1f" * 16, RESPONSES), "tool_exception": ("2f" * 16, TOOL_EXCEPTION),
          "guardrail": ("3f" * 16, GUARDRAIL_TRIP)}


@pytest.fixture(scope="module")
def trials(tmp_path_factory) -> dict[str, dict]:
    s = start_sidecar(tmp_path_factory.mktemp("logfire"))
    try:
        for tid, snap in TRACES.values():
            r = httpx.post(f"{s.otlp_http}/v1/traces", json=_otlp(snap, tid), timeout=60)
            assert r.status_code == 200 and r.json() == {}, r.text
        assert s.post("/api/v1/flush").status_code == 200
        by_trace: dict[str, list] = {}
        for t in s.trials():
            by_trace.setdefault(t["trace_id"], []).append(t)
        out = {}
        for name, (tid, _) in TRACES.items():
            assert len(by_trace.get(tid, [])) == 1, by_trace.get(tid)  # one trial per run
            out[name] = by_trace[tid][0]
        out["groups"] = {g["agent"] for g in s.report()["groups"]}
        return out
    finally:
        s.kill()


def test_handoff_run_root_steps_tokens_and_agent(trials):
    t = trials["responses"]
    assert t["root_span_id"] == f"{1:016x}"  # the "OpenAI Agents trace" span, not a Turn span
    assert t["agent_name"] == "agent1"  # the entry agent, not service.name
    # model call, the function tool, the handoff, agent2's model call — in causal order
    assert t["actions"] == ["llm", "random_number", "handoff:agent2", "llm"]
    [fn] = [s for s in t["steps"] if s["action"] == "random_number"]
    assert (fn["arguments"], fn["result"], fn["error"]) == ({}, 4, None)
    # the transfer_to_agent2 call is answered by the handoff span: nothing is missing
    assert "missing_tool_span" not in t["flags"]
    assert (t["model_calls"], t["tool_calls"], t["tool_errors"]) == (2, 1, 0)
    # only the second Responses span reports gen_ai.usage (89 in, 18 out); the first reports
    # none, so the sums are lower bounds, flagged
    assert (t["input_tokens"], t["output_tokens"], t["total_tokens"]) == (89, 18, 107)
    assert "partial_usage" in t["flags"]


def test_function_tool_exception_is_a_failed_tool_call(trials):
    t = trials["tool_exception"]
    assert t["agent_name"] == "Start Agent"
    assert t["actions"] == ["llm", "tool", "llm"]
    [tool] = [s for s in t["steps"] if s["action"] == "tool"]
    assert tool["error"] == "RuntimeError" and tool["result"] == TOOL_OUT
    assert (t["tool_calls"], t["tool_errors"]) == (1, 1)
    assert (t["input_tokens"], t["output_tokens"]) == (244 + 283, 10 + 26)


def test_guardrail_trip_is_a_refusal(trials):
    t = trials["guardrail"]
    assert t["agent_name"] == "my_agent"
    assert t["actions"] == ["decision:refuse"]
    assert (t["input_tokens"], t["output_tokens"]) == (None, None)  # no model call: unknown


def test_agents_are_separate_groups_not_the_service(trials):
    assert {"agent1", "Start Agent", "my_agent"} <= trials["groups"]
    assert "agents-app" not in trials["groups"]
