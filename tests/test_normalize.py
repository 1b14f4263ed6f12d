"""Convention normalization on hand-built CanonicalSpans (one per convention and tricky case).

Expected values are written from the attribute values set in each test, not from the code.
"""

from __future__ import annotations

import json

import pytest

from relyscope.collector.normalize import CONVENTIONS, detect_conventions, normalize
from relyscope.model import CanonicalSpan, Evaluation, Op, SpanEvent

TRACE = "0af7651916cd43dd8448eb211c80319c"


def span(attrs=None, *, name="s", events=(), status_code=0, status_message="", scope="",
         parent="", resource=None) -> CanonicalSpan:
    return CanonicalSpan(
        trace_id=TRACE,
        span_id="b7ad6b7169203331",
        parent_span_id=parent,
        name=name,
        kind=1,
        start_ns=1_000,
        end_ns=2_000,
        status_code=status_code,
        status_message=status_message,
        attributes=attrs or {},
        resource=resource or {},
        scope_name=scope,
        events=tuple(events),
    )


# --- GenAI semconv -------------------------------------------------------------------------------


def test_genai_agent_root_with_relyscope_attributes():
    s = normalize(
        span(
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "support-bot",
                "gen_ai.agent.id": "asst_42",
                "gen_ai.agent.version": "2.1.0",
                "gen_ai.conversation.id": "conv-7",
                "gen_ai.invocation.is_nested": False,
                "gen_ai.input.messages": json.dumps(
                    [
                        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
                        {"role": "user", "parts": [{"type": "text", "content": "Refund order 17"}]},
                        {"role": "user", "parts": [{"type": "text", "content": "second"}]},
                    ]
                ),
                "relyscope.task.id": "refund-17",
                "relyscope.trial.id": "t-1",
                "relyscope.run.kind": "Shadow",
                "relyscope.outcome": "success",
                "relyscope.outcome.score": 0.75,
                "relyscope.outcome.source": "db_state",
                "relyscope.claimed_success": True,
                "relyscope.confidence": 0.9,
                "relyscope.decision": "act",
                "relyscope.shadow.of": "t-0",
                "relyscope.perturbation.family": "fault",
                "relyscope.perturbation.strength": "mild",
                "relyscope.trial.separate": True,
            },
            resource={"service.name": "svc", "service.version": "9.9"},
        )
    )
    assert s.op is Op.AGENT
    assert s.convention == "genai"
    assert (s.agent_name, s.agent_id, s.agent_version) == ("support-bot", "asst_42", "2.1.0")
    assert s.is_nested is False
    assert s.conversation_id == "conv-7"
    assert s.first_user_input == "Refund order 17"
    assert (s.task_id, s.trial_id, s.run_kind) == ("refund-17", "t-1", "shadow")
    assert (s.outcome, s.outcome_score, s.outcome_source) == ("success", 0.75, "db_state")
    assert s.claimed_success is True
    assert s.confidence == 0.9
    assert s.decision == "act"
    assert s.shadow_of == "t-0"
    assert (s.perturbation_family, s.perturbation_strength) == ("fault", "mild")
    assert s.separate_trial is True


def test_agent_name_not_taken_from_resource():
    s = normalize(
        span({"gen_ai.operation.name": "invoke_agent"}, resource={"service.name": "svc",
                                                                  "service.version": "1"})
    )
    assert s.op is Op.AGENT
    assert s.agent_name is None and s.agent_version is None


def test_genai_chat_tokens_finish_and_requested_tool_calls():
    out = [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "Checking."},
                {"type": "tool_call", "id": "call_a", "name": "lookup", "arguments": {"q": 1}},
                {"type": "tool_call", "id": "call_b", "name": "lookup", "arguments": {"q": 2}},
            ],
            "finish_reason": "tool_call",
        }
    ]
    s = normalize(
        span(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "anthropic",
                "gen_ai.request.model": "claude-x",
                "gen_ai.response.model": "claude-x-2026",
                "gen_ai.usage.input_tokens": 1200,
                "gen_ai.usage.output_tokens": 80,
                "gen_ai.usage.cache_read.input_tokens": 1000,
                "gen_ai.usage.cache_write.input_tokens": 150,
                "gen_ai.usage.reasoning_tokens": 30,
                "gen_ai.response.finish_reasons": ["tool_call"],
                "gen_ai.output.messages": out,  # already a list (array/kvlist attribute)
            }
        )
    )
    assert s.op is Op.LLM
    assert s.provider == "anthropic"
    assert s.model == "claude-x-2026"  # the model that served the call
    assert (s.input_tokens, s.output_tokens) == (1200, 80)
    assert (s.cache_read_tokens, s.cache_write_tokens, s.reasoning_tokens) == (1000, 150, 30)
    assert s.total_tokens == 1280  # 1200 + 80, derived when no total is given
    assert s.finish_reasons == ("tool_call",)
    assert s.requested_tool_calls == ("call_a", "call_b")


def test_genai_legacy_names():
    s = normalize(
        span(
            {
                "gen_ai.operation.name": "text_completion",
                "gen_ai.system": "openai",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.prompt_tokens": 10,
                "gen_ai.usage.completion_tokens": "5",  # string-encoded int
                "gen_ai.usage.cache_creation_input_tokens": 7,
                "gen_ai.usage.cache_read_input_tokens": 3,
            }
        )
    )
    assert s.op is Op.LLM
    assert s.provider == "openai"
    assert s.model == "gpt-4o"
    assert (s.input_tokens, s.output_tokens, s.total_tokens) == (10, 5, 15)
    assert (s.cache_write_tokens, s.cache_read_tokens) == (7, 3)


def test_current_name_wins_over_legacy_alias():
    s = normalize(span({"gen_ai.operation.name": "chat", "gen_ai.provider.name": "new",
                        "gen_ai.system": "old", "gen_ai.usage.input_tokens": 4,
                        "gen_ai.usage.prompt_tokens": 99}))
    assert (s.provider, s.input_tokens) == ("new", 4)


@pytest.mark.parametrize(
    ("op_name", "op"),
    [
        ("invoke_agent", Op.AGENT),
        ("invoke_workflow", Op.WORKFLOW),
        ("handle_conversation_turn", Op.WORKFLOW),
        ("chat", Op.LLM),
        ("generate_content", Op.LLM),
        ("embeddings", Op.EMBEDDING),
        ("execute_tool", Op.TOOL),
        ("create_agent", Op.UNKNOWN),
        ("something_new", Op.UNKNOWN),
    ],
)
def test_genai_operation_mapping(op_name, op):
    assert normalize(span({"gen_ai.operation.name": op_name})).op is op


# --- tool arguments: decode JSON once, never twice, never re-encode ------------------------------


def _tool(args, result=None):
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t",
             "gen_ai.tool.call.id": "call_1", "gen_ai.tool.call.arguments": args}
    if result is not None:
        attrs["gen_ai.tool.call.result"] = result
    return normalize(span(attrs))


def test_json_string_arguments_decoded():
    s = _tool('{"city": "Paris", "days": 3}', '[1, 2]')
    assert s.op is Op.TOOL and s.tool_name == "t" and s.tool_call_id == "call_1"
    assert s.tool_arguments == {"city": "Paris", "days": 3}
    assert s.tool_result == [1, 2]


def test_kvlist_and_nested_map_arguments_kept_as_is():
    nested = {"filter": {"status": ["open", "closed"], "limit": 5}, "flag": True}
    assert _tool(nested).tool_arguments == nested
    assert _tool({"a": "1"}).tool_arguments == {"a": "1"}


def test_string_that_is_json_of_a_string_decoded_once_only():
    inner = '{"x": 1}'
    encoded_twice = json.dumps(inner)  # '"{\\"x\\": 1}"'
    s = _tool(encoded_twice)
    assert s.tool_arguments == inner  # one decode: a str, not the dict {"x": 1}
    assert isinstance(s.tool_arguments, str)


def test_plain_text_and_bare_scalars_stay_strings():
    assert _tool("just text", "winner").tool_arguments == "just text"
    assert _tool("just text", "winner").tool_result == "winner"
    assert _tool("42").tool_arguments == "42"
    assert _tool("null").tool_arguments == "null"
    assert _tool("{broken json").tool_arguments == "{broken json"


# --- OpenInference -------------------------------------------------------------------------------


def test_openinference_llm_tokens_cost_messages():
    s = normalize(
        span(
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4o-mini",
                "llm.provider": "openai",
                "llm.token_count.prompt": 300,
                "llm.token_count.completion": 40,
                "llm.token_count.total": 340,
                "llm.token_count.prompt_details.cache_read": 256,
                "llm.token_count.completion_details.reasoning": 12,
                "llm.cost.total": 0.00123,
                "session.id": "sess-1",
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": "sys",
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.contents.0.message_content.type": "text",
                "llm.input_messages.1.message.contents.0.message_content.text": "Book a table",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.tool_calls.0.tool_call.id": "call_x",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "book",
                "llm.output_messages.0.message.tool_calls.1.tool_call.id": "call_y",
                "llm.output_messages.1.message.tool_calls.0.tool_call.id": "call_z",
            }
        )
    )
    assert s.op is Op.LLM and s.convention == "openinference"
    assert (s.model, s.provider) == ("gpt-4o-mini", "openai")
    assert (s.input_tokens, s.output_tokens, s.total_tokens) == (300, 40, 340)
    assert (s.cache_read_tokens, s.reasoning_tokens) == (256, 12)
    assert s.cost_usd == pytest.approx(0.00123)
    assert s.conversation_id == "sess-1"
    assert s.first_user_input == "Book a table"
    assert s.requested_tool_calls == ("call_x", "call_y", "call_z")


def test_openinference_cost_from_parts():
    s = normalize(span({"openinference.span.kind": "LLM", "llm.cost.prompt": 0.25,
                        "llm.cost.completion": 0.5}))
    assert s.cost_usd == pytest.approx(0.75)


def test_openinference_tool():
    s = normalize(
        span(
            {
                "openinference.span.kind": "TOOL",
                "tool.name": "search",
                "input.value": '{"query": "otel"}',
                "input.mime_type": "application/json",
                "output.value": "3 results",
            }
        )
    )
    assert s.op is Op.TOOL
    assert s.tool_name == "search"
    assert s.tool_arguments == {"query": "otel"}
    assert s.tool_result == "3 results"
    assert s.first_user_input is None  # a tool's input is not the user's task


def test_openinference_agent_input_value_is_first_user_input():
    s = normalize(span({"openinference.span.kind": "AGENT", "agent.name": "planner",
                        "input.value": "Plan my trip"}))
    assert s.op is Op.AGENT and s.agent_name == "planner"
    assert s.first_user_input == "Plan my trip"


@pytest.mark.parametrize(
    ("kind", "op"),
    [
        ("AGENT", Op.AGENT),
        ("CHAIN", Op.WORKFLOW),
        ("RETRIEVER", Op.RETRIEVAL),
        ("EMBEDDING", Op.EMBEDDING),
        ("GUARDRAIL", Op.GUARDRAIL),
        ("llm", Op.LLM),
        ("EVALUATOR", Op.UNKNOWN),
        ("NEW_KIND", Op.UNKNOWN),
    ],
)
def test_openinference_kinds(kind, op):
    assert normalize(span({"openinference.span.kind": kind})).op is op


# --- OpenLLMetry ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "op"),
    [("workflow", Op.WORKFLOW), ("task", Op.WORKFLOW), ("agent", Op.AGENT), ("tool", Op.TOOL)],
)
def test_openllmetry_kinds(kind, op):
    s = normalize(span({"traceloop.span.kind": kind, "traceloop.entity.name": "thing"}))
    assert s.op is op and s.convention == "openllmetry"


def test_openllmetry_tool_and_session():
    s = normalize(
        span(
            {
                "traceloop.span.kind": "tool",
                "traceloop.entity.name": "get_weather",
                "traceloop.entity.input": '{"args": [], "kwargs": {"city": "Oslo"}}',
                "traceloop.entity.output": '{"temp": -3}',
                "traceloop.association.properties.session_id": "chat-9",
            }
        )
    )
    assert s.op is Op.TOOL and s.tool_name == "get_weather"
    assert s.tool_arguments == {"city": "Oslo"}
    assert s.tool_result == {"temp": -3}
    assert s.conversation_id == "chat-9"


def test_openllmetry_agent_name_and_llm_messages():
    a = normalize(span({"traceloop.span.kind": "agent", "traceloop.entity.name": "triage"}))
    assert a.op is Op.AGENT and a.agent_name == "triage"
    s = normalize(
        span(
            {
                "llm.request.type": "chat",
                "gen_ai.system": "OpenAI",
                "gen_ai.request.model": "gpt-4",
                "gen_ai.prompt.0.role": "system",
                "gen_ai.prompt.0.content": "sys",
                "gen_ai.prompt.1.role": "user",
                "gen_ai.prompt.1.content": "Weather in Oslo?",
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.finish_reason": "tool_calls",
                "gen_ai.completion.0.tool_calls.0.id": "call_1",
                "gen_ai.completion.0.tool_calls.0.name": "get_weather",
                "llm.usage.total_tokens": 50,
            }
        )
    )
    assert s.op is Op.LLM
    assert s.first_user_input == "Weather in Oslo?"
    assert s.finish_reasons == ("tool_calls",)
    assert s.requested_tool_calls == ("call_1",)
    assert s.total_tokens == 50


# --- OpenAI Agents SDK bridges -------------------------------------------------------------------


def test_openai_agents_contrib_handoff():
    s = normalize(
        span(
            {
                "gen_ai.operation.name": "agent_handoff",
                "gen_ai.provider.name": "openai",
                "gen_ai.handoff.from_agent": "Triage",
                "gen_ai.handoff.to_agent": "Billing",
            }
        )
    )
    assert s.op is Op.HANDOFF
    assert s.handoff_target == "Billing"
    assert s.convention == "openai_agents"


def test_openai_agents_contrib_guardrail_triggered_is_refuse():
    s = normalize(span({"gen_ai.operation.name": "guardrail_check",
                        "gen_ai.guardrail.name": "no_pii", "gen_ai.guardrail.triggered": True}))
    assert s.op is Op.GUARDRAIL
    assert s.guardrail_triggered is True
    assert s.decision == "refuse"


def test_guardrail_not_triggered_has_no_inferred_decision():
    s = normalize(span({"gen_ai.operation.name": "guardrail_check",
                        "gen_ai.guardrail.triggered": False}))
    assert s.op is Op.GUARDRAIL and s.guardrail_triggered is False and s.decision is None


def test_explicit_relyscope_decision_wins_over_guardrail_inference():
    s = normalize(span({"gen_ai.operation.name": "guardrail_check",
                        "gen_ai.guardrail.triggered": "true", "relyscope.decision": "ask"}))
    assert s.guardrail_triggered is True and s.decision == "ask"


def test_openai_agents_via_openinference_handoff_and_agent():
    scope = "openinference.instrumentation.openai_agents"
    h = normalize(span({"openinference.span.kind": "TOOL", "llm.system": "openai"},
                       name="handoff to Refunds", scope=scope, parent="1111111111111111"))
    assert h.op is Op.HANDOFF and h.handoff_target == "Refunds"
    ag = normalize(span({"openinference.span.kind": "AGENT"}, name="Refunds", scope=scope,
                        parent="1111111111111111"))
    assert ag.op is Op.AGENT and ag.agent_name == "Refunds"
    root = normalize(span({"openinference.span.kind": "AGENT"}, name="Agent workflow",
                          scope=scope))
    assert root.op is Op.AGENT and root.agent_name is None
    tool = normalize(span({"openinference.span.kind": "TOOL", "tool.name": "refund"},
                          name="refund", scope=scope, parent="1111111111111111"))
    assert tool.op is Op.TOOL and tool.tool_name == "refund" and tool.handoff_target is None


def test_openai_agents_via_logfire_guardrail_and_handoff():
    g = normalize(span({"type": "guardrail", "name": "math_check", "triggered": True,
                        "logfire.msg_template": "Guardrail {name} triggered={triggered}"}))
    assert g.op is Op.GUARDRAIL and g.decision == "refuse"
    h = normalize(span({"type": "handoff", "from_agent": "A", "to_agent": "B"}))
    assert h.op is Op.HANDOFF and h.handoff_target == "B"


# --- other emitters ------------------------------------------------------------------------------


def test_vercel_ai_legacy_tool_and_generate():
    t = normalize(span({"ai.operationId": "ai.toolCall", "ai.toolCall.name": "weather",
                        "ai.toolCall.id": "tc1", "ai.toolCall.args": '{"loc": "SF"}',
                        "ai.toolCall.result": '"sunny"'}))
    assert t.op is Op.TOOL and t.tool_name == "weather" and t.tool_call_id == "tc1"
    assert t.tool_arguments == {"loc": "SF"}
    assert t.tool_result == "sunny"
    g = normalize(span({"ai.operationId": "ai.generateText.doGenerate", "ai.model.id": "gpt-4o",
                        "ai.model.provider": "openai.chat", "ai.usage.promptTokens": 20,
                        "ai.usage.completionTokens": 7, "ai.response.finishReason": "stop",
                        "ai.prompt.messages": '[{"role":"user","content":[{"type":"text",'
                                              '"text":"hi there"}]}]',
                        "ai.response.toolCalls": '[{"toolCallId":"tc9","toolName":"w"}]'}))
    assert g.op is Op.LLM and g.model == "gpt-4o" and g.provider == "openai.chat"
    assert (g.input_tokens, g.output_tokens, g.total_tokens) == (20, 7, 27)
    assert g.finish_reasons == ("stop",)
    assert g.first_user_input == "hi there"
    assert g.requested_tool_calls == ("tc9",)


def test_langfuse_tool_and_error_level():
    s = normalize(span({"langfuse.observation.type": "tool",
                        "langfuse.observation.input": '{"id": 5}',
                        "langfuse.observation.output": "ok",
                        "langfuse.observation.level": "ERROR",
                        "langfuse.observation.status_message": "timeout"}, name="fetch"))
    assert s.op is Op.TOOL and s.tool_name == "fetch"
    assert s.tool_arguments == {"id": 5} and s.tool_result == "ok"
    assert s.error_type == "timeout"


def test_pydantic_ai_agent_run():
    s = normalize(span({"agent_name": "bank_agent", "model_name": "gpt-4o",
                        "logfire.msg": "bank_agent run"}, name="agent run"))
    assert s.op is Op.AGENT and s.agent_name == "bank_agent" and s.convention == "pydantic_ai"


def test_user_message_event_first_user_input_and_choice_event():
    s = normalize(
        span(
            {"gen_ai.operation.name": "chat"},
            events=[
                SpanEvent("gen_ai.system.message", 1, {"content": "sys"}),
                SpanEvent("gen_ai.user.message", 2, {"content": "first question"}),
                SpanEvent("gen_ai.user.message", 3, {"content": "second question"}),
                SpanEvent("gen_ai.choice", 4, {"finish_reason": "tool_calls", "message": json.dumps(
                    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]})}),
            ],
        )
    )
    assert s.first_user_input == "first question"
    assert s.finish_reasons == ("tool_calls",)
    assert s.requested_tool_calls == ("c1",)


# --- errors, evaluations, validation -------------------------------------------------------------


def test_error_type_attribute_wins():
    s = normalize(span({"gen_ai.operation.name": "execute_tool", "error.type": "TimeoutError"},
                       status_code=2, status_message="boom"))
    assert s.error_type == "TimeoutError"


def test_error_from_status():
    assert normalize(span({}, status_code=2, status_message="boom")).error_type == "boom"
    assert normalize(span({}, status_code=2)).error_type == "error"
    assert normalize(span({}, status_code=1)).error_type is None


def test_error_from_exception_event():
    ev = SpanEvent("exception", 5, {"exception.type": "ValueError", "exception.message": "bad"})
    assert normalize(span({"openinference.span.kind": "TOOL"}, events=[ev])).error_type == (
        "ValueError"
    )
    assert normalize(span({}, events=[SpanEvent("exception", 5, {})])).error_type == "exception"


def test_evaluation_events():
    s = normalize(
        span(
            {"gen_ai.operation.name": "invoke_agent"},
            events=[
                SpanEvent("gen_ai.evaluation.result", 9, {
                    "gen_ai.evaluation.name": "Relevance",
                    "gen_ai.evaluation.score.value": 0.8,
                    "gen_ai.evaluation.score.label": "relevant",
                    "gen_ai.evaluation.explanation": "on topic",
                }),
                SpanEvent("gen_ai.evaluation.result", 10, {"gen_ai.evaluation.name": "Tox",
                                                           "gen_ai.evaluation.score.label": "ok"}),
            ],
        )
    )
    assert s.evaluations == (
        Evaluation("Relevance", 0.8, "relevant", "on topic"),
        Evaluation("Tox", None, "ok", None),
    )


@pytest.mark.parametrize("bad", [1.5, -0.1, "high", float("nan"), True])
def test_confidence_outside_unit_interval_is_none(bad):
    s = normalize(span({"relyscope.confidence": bad, "relyscope.outcome.score": bad}))
    assert s.confidence is None and s.outcome_score is None


def test_confidence_bounds_inclusive_and_string_numbers():
    assert normalize(span({"relyscope.confidence": 0})).confidence == 0.0
    assert normalize(span({"relyscope.confidence": "1"})).confidence == 1.0


def test_invalid_enums_become_none_and_side_effect_fault():
    s = normalize(span({"relyscope.outcome": "maybe", "relyscope.decision": "dance",
                        "relyscope.run.kind": "prod", "relyscope.tool.side_effect": "WRITE",
                        "relyscope.fault.type": "timeout"}))
    assert (s.outcome, s.decision, s.run_kind) == (None, None, None)
    assert s.side_effect == "write" and s.fault_type == "timeout"
    assert s.convention == "relyscope"


def test_unknown_span_and_garbage_never_raise():
    s = normalize(span({}, name="openai.chat.completions"))
    assert s.op is Op.UNKNOWN and s.convention == "unknown"
    g = normalize(span({"gen_ai.operation.name": 7, "gen_ai.usage.input_tokens": "abc",
                        "gen_ai.usage.output_tokens": -3, "gen_ai.input.messages": 12,
                        "gen_ai.output.messages": "[not json", "gen_ai.tool.call.arguments": b"\x00",
                        "llm.token_count.prompt": True, "openinference.span.kind": ["LLM"],
                        "relyscope.trial.separate": "yes"}))
    assert g.op is Op.UNKNOWN
    assert g.input_tokens is None and g.output_tokens is None
    assert g.tool_arguments == b"\x00"
    assert g.separate_trial is False


def test_inferred_op_when_no_kind_attribute():
    assert normalize(span({"gen_ai.tool.name": "x"})).op is Op.TOOL
    assert normalize(span({"gen_ai.response.model": "m"})).op is Op.LLM


def test_detect_conventions_and_version_table():
    s = span({"gen_ai.operation.name": "execute_tool", "gcp.vertex.agent.tool_call_args": "{}",
              "openinference.span.kind": "TOOL", "relyscope.fault.type": "x"})
    assert detect_conventions(s) == ("relyscope", "genai", "adk", "openinference")
    for name in ("genai", "openinference", "openllmetry", "openai_agents", "relyscope"):
        assert CONVENTIONS[name].version
    assert CONVENTIONS["genai"].attrs["provider"] == ("gen_ai.provider.name", "gen_ai.system")


@pytest.mark.parametrize("value, outcome", [
    ("success", "success"), (" FAILURE ", "failure"), ("unknown", "unknown"),
    (True, "success"), (False, "failure"), ("true", "success"), ("False", "failure"), (1, "success"), (0, "failure"),
    ("pass", "success"), ("Passed", "success"), ("succeeded", "success"), ("fail", "failure"), ("FAILED", "failure"),
    (1.0, "success"), (0.0, "failure"), ("1", "success"), (" 0 ", "failure"),
    ("maybe", None), (2, None), (0.5, None), (2.0, None), ("", None), (["success"], None),
])
def test_outcome_values_a_verifier_writes(value, outcome):
    """``span.set_attribute("relyscope.outcome", True)`` (a bool, the natural thing to write),
    ``"true"``, 1 or ``"pass"`` were refused: the run's outcome stayed unknown, silently, while the
    report advised setting the attribute it carried. Both normalizers agree (the fast one is
    tested against this one)."""
    from relyscope.collector.normalize.fast import normalize_fast

    s = span({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a", "relyscope.outcome": value})
    assert normalize(s).outcome == outcome
    assert normalize_fast(s).outcome == outcome
