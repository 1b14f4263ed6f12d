"""Versioned attribute-name tables of every span convention the collector reads (conventions.md §3).

One table, so a rename in a moving spec is a one-line change here. Each entry maps a logical field
to a tuple of attribute names in priority order (current name first, then legacy aliases). The
mapping modules bind these names to module constants at import time; nothing else spells them.

GenAI semconv names come from :mod:`relyscope.semconv` (the project's one constants module); the
non-spec and pre-move aliases that real emitters still send are listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Mapping

from relyscope import semconv as sc

__all__ = ["ConventionSpec", "CONVENTIONS", "names", "SCORING_KEYS", "EXACT_KEYS", "HISTORY_PREFIXES",
           "attribute_rank", "never_truncate"]


@dataclass(frozen=True, slots=True)
class ConventionSpec:
    """One convention: ``version`` is the spec/emitter version the names follow; ``attrs`` maps a
    logical field to attribute names in priority order (current first, legacy aliases after)."""

    name: str
    version: str
    attrs: Mapping[str, tuple[str, ...]]


def _spec(name: str, version: str, attrs: dict[str, tuple[str, ...]]) -> ConventionSpec:
    return ConventionSpec(name, version, MappingProxyType(attrs))


CONVENTIONS: Final[Mapping[str, ConventionSpec]] = MappingProxyType(
    {
        "genai": _spec(
            "genai",
            sc.GENAI_SEMCONV_VERSION + " + pre-move aliases (semantic-conventions v1.26–v1.37)",
            {
                "operation": (sc.GEN_AI_OPERATION_NAME,),
                "provider": (sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_SYSTEM),
                "agent_name": (sc.GEN_AI_AGENT_NAME,),
                "agent_id": (sc.GEN_AI_AGENT_ID,),
                "agent_version": (sc.GEN_AI_AGENT_VERSION,),
                "conversation_id": (sc.GEN_AI_CONVERSATION_ID,),
                "is_nested": (sc.GEN_AI_INVOCATION_IS_NESTED,),
                "request_model": (sc.GEN_AI_REQUEST_MODEL,),
                "response_model": (sc.GEN_AI_RESPONSE_MODEL,),
                "finish_reasons": (sc.GEN_AI_RESPONSE_FINISH_REASONS,),
                "input_tokens": (sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_PROMPT_TOKENS),
                "output_tokens": (sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.GEN_AI_USAGE_COMPLETION_TOKENS),
                "cache_read_tokens": (
                    sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                    "gen_ai.usage.cache_read_input_tokens",
                ),
                "cache_write_tokens": (
                    sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS,
                    "gen_ai.usage.cache_creation.input_tokens",
                    "gen_ai.usage.cache_creation_input_tokens",
                ),
                "reasoning_tokens": (
                    sc.GEN_AI_USAGE_REASONING_TOKENS,
                    "gen_ai.usage.reasoning.output_tokens",
                ),
                "total_tokens": ("gen_ai.usage.total_tokens",),  # not in the spec; OpenLIT & co.
                "tool_name": (sc.GEN_AI_TOOL_NAME,),
                "tool_call_id": (sc.GEN_AI_TOOL_CALL_ID,),
                "tool_type": (sc.GEN_AI_TOOL_TYPE,),
                "tool_arguments": (sc.GEN_AI_TOOL_CALL_ARGUMENTS,),
                "tool_result": (sc.GEN_AI_TOOL_CALL_RESULT,),
                "input_messages": (sc.GEN_AI_INPUT_MESSAGES,),
                "output_messages": (sc.GEN_AI_OUTPUT_MESSAGES,),
                # pre-2025 event-based content (Semantic Kernel, Strands, older instrumentations)
                "user_message_event": ("gen_ai.user.message",),
                "choice_event": ("gen_ai.choice",),
                "error_type": (sc.ERROR_TYPE,),
                "evaluation_event": (sc.GEN_AI_EVALUATION_RESULT_EVENT,),
                "evaluation_name": (sc.GEN_AI_EVALUATION_NAME,),
                "evaluation_score": (sc.GEN_AI_EVALUATION_SCORE_VALUE,),
                "evaluation_label": (sc.GEN_AI_EVALUATION_SCORE_LABEL,),
                "evaluation_explanation": (sc.GEN_AI_EVALUATION_EXPLANATION,),
            },
        ),
        "openinference": _spec(
            "openinference",
            "openinference-semantic-conventions 0.1.x",
            {
                "span_kind": ("openinference.span.kind",),
                "agent_name": ("agent.name",),
                "tool_name": ("tool.name",),
                "tool_call_id": ("tool_call.id",),
                "tool_call_arguments": ("tool_call.function.arguments",),
                "input_value": ("input.value",),
                "output_value": ("output.value",),
                "model": ("llm.model_name",),
                "provider": ("llm.provider", "llm.system"),
                "input_tokens": ("llm.token_count.prompt",),
                "output_tokens": ("llm.token_count.completion",),
                "total_tokens": ("llm.token_count.total",),
                "cache_read_tokens": ("llm.token_count.prompt_details.cache_read",),
                "cache_write_tokens": ("llm.token_count.prompt_details.cache_write",),
                "reasoning_tokens": ("llm.token_count.completion_details.reasoning",),
                "cost_total": ("llm.cost.total",),
                "cost_parts": ("llm.cost.prompt", "llm.cost.completion"),
                "session_id": ("session.id",),
                "input_messages_prefix": ("llm.input_messages.",),
                "output_messages_prefix": ("llm.output_messages.",),
            },
        ),
        "openllmetry": _spec(
            "openllmetry",
            "traceloop openllmetry 0.33–0.40 (opentelemetry-semantic-conventions-ai)",
            {
                "span_kind": ("traceloop.span.kind",),
                "entity_name": ("traceloop.entity.name",),
                "entity_input": ("traceloop.entity.input",),
                "entity_output": ("traceloop.entity.output",),
                "workflow_name": ("traceloop.workflow.name",),
                "session_id": ("traceloop.association.properties.session_id",),
                "request_type": ("llm.request.type",),
                "total_tokens": ("llm.usage.total_tokens",),
                "prompt_prefix": ("gen_ai.prompt.",),
                "completion_prefix": ("gen_ai.completion.",),
            },
        ),
        "openai_agents": _spec(
            "openai_agents",
            "opentelemetry-instrumentation-openai-agents-v2 0.1 / openinference-instrumentation-"
            "openai-agents 1.x / logfire openai-agents integration",
            {
                "op_handoff": ("agent_handoff",),  # gen_ai.operation.name values (contrib bridge)
                "op_guardrail": ("guardrail_check",),
                "handoff_to": ("gen_ai.handoff.to_agent",),
                "handoff_from": ("gen_ai.handoff.from_agent",),
                "guardrail_name": ("gen_ai.guardrail.name",),
                "guardrail_triggered": ("gen_ai.guardrail.triggered",),
                "oi_scope": ("openinference.instrumentation.openai_agents",),
                "oi_handoff_name_prefix": ("handoff to ",),
                "logfire_type": ("type",),  # logfire exports span_data fields as attributes
                "logfire_to_agent": ("to_agent",),
                "logfire_triggered": ("triggered",),
                "logfire_name": ("name",),
                # Logfire's own OpenAI Agents integration (logfire.instrument_openai_agents): no
                # ``type`` attribute; the span *name* is the message template
                "lf_template": ("logfire.msg_template",),
                "lf_trace_name": ("OpenAI Agents trace: {name}",),
                "lf_task_prefix": ("Task: ",),
                "lf_agent_name": ("Agent run: {name!r}",),
                "lf_turn_prefix": ("Turn {turn} for agent ",),
                "lf_function_name": ("Function: {name}",),
                "lf_handoff_name": ("Handoff: {from_agent} → {to_agent}",),
                "lf_guardrail_prefix": ("Guardrail {name!r}",),
                "lf_model_prefixes": ("Responses API with ", "Chat completion with "),
                "lf_input": ("input",),
                "lf_output": ("output",),
                "lf_error": ("error",),
                "lf_events": ("events",),
                "lf_from_agent": ("from_agent",),
            },
        ),
        "adk": _spec(
            "adk",
            "google-adk 1.x (gcp.vertex.agent.*)",
            {
                "system_value": ("gcp.vertex.agent",),
                "tool_call_args": ("gcp.vertex.agent.tool_call_args",),
                "tool_response": ("gcp.vertex.agent.tool_response",),
                "llm_request": ("gcp.vertex.agent.llm_request",),
                "llm_response": ("gcp.vertex.agent.llm_response",),
                "session_id": ("gcp.vertex.agent.session_id",),
                "invocation_id": ("gcp.vertex.agent.invocation_id",),
                "event_id": ("gcp.vertex.agent.event_id",),
            },
        ),
        "pydantic_ai": _spec(
            "pydantic_ai",
            "pydantic-ai 0.7 (logfire instrumentation, InstrumentationSettings version 1)",
            {
                "tool_arguments": ("tool_arguments",),
                "tool_response": ("tool_response",),
                "agent_name": ("agent_name",),
                "model_name": ("model_name",),
                "logfire_msg": ("logfire.msg", "logfire.msg_template"),
                "scope": ("pydantic-ai",),
            },
        ),
        "vercel_ai": _spec(
            "vercel_ai",
            "Vercel AI SDK 4–5 ai.* telemetry (v7 emits GenAI semconv, read by 'genai')",
            {
                "operation_id": ("ai.operationId",),
                "tool_name": ("ai.toolCall.name",),
                "tool_call_id": ("ai.toolCall.id",),
                "tool_arguments": ("ai.toolCall.args", "ai.toolCall.input"),
                "tool_result": ("ai.toolCall.result", "ai.toolCall.output"),
                "model": ("ai.response.model", "ai.model.id"),
                "provider": ("ai.model.provider",),
                "input_tokens": ("ai.usage.inputTokens", "ai.usage.promptTokens"),
                "output_tokens": ("ai.usage.outputTokens", "ai.usage.completionTokens"),
                "total_tokens": ("ai.usage.totalTokens",),
                "reasoning_tokens": ("ai.usage.reasoningTokens",),
                "cache_read_tokens": ("ai.usage.cachedInputTokens",),
                "finish_reason": ("ai.response.finishReason",),
                "prompt": ("ai.prompt",),
                "prompt_messages": ("ai.prompt.messages",),
                "response_tool_calls": ("ai.response.toolCalls",),
            },
        ),
        "genkit": _spec(
            "genkit",
            "Firebase Genkit 1.x (genkit:* attributes)",
            {
                "type": ("genkit:type",),
                "subtype": ("genkit:metadata:subtype",),
                "name": ("genkit:name",),
                "input": ("genkit:input",),
                "output": ("genkit:output",),
                "session_id": ("genkit:sessionId",),
            },
        ),
        "langfuse": _spec(
            "langfuse",
            "Langfuse SDK 2.60 / 3.x OTel attributes",
            {
                "type": ("langfuse.observation.type",),
                "level": ("langfuse.observation.level",),
                "status_message": ("langfuse.observation.status_message",),
                "input": ("langfuse.observation.input",),
                "output": ("langfuse.observation.output",),
                "model": ("langfuse.observation.model.name",),
                "usage_details": ("langfuse.observation.usage_details",),
                "cost_details": ("langfuse.observation.cost_details",),
                "session_id": ("langfuse.session.id", "session.id"),
            },
        ),
        "openlit": _spec(
            "openlit",
            "OpenLIT 1.x",
            {
                "cost": ("gen_ai.usage.cost",),
                "prompt_event": ("gen_ai.content.prompt",),
                "prompt_event_attr": ("gen_ai.prompt",),
                "sdk_name_value": ("openlit",),
            },
        ),
        "semantic_kernel": _spec(
            "semantic_kernel",
            "Microsoft Semantic Kernel 1.55+ (GenAI semconv with event-carried messages)",
            {
                "scope_prefix": ("Microsoft.SemanticKernel",),
                "llm_operations": ("chat.completions", "text.completions", "chat_completion"),
            },
        ),
        "relyscope": _spec(
            "relyscope",
            "relyscope extension attributes v1 (conventions.md §2)",
            {
                "task_id": (sc.RS_TASK_ID,),
                "trial_id": (sc.RS_TRIAL_ID,),
                "run_kind": (sc.RS_RUN_KIND,),
                "outcome": (sc.RS_OUTCOME,),
                "outcome_score": (sc.RS_OUTCOME_SCORE,),
                "outcome_source": (sc.RS_OUTCOME_SOURCE,),
                "claimed_success": (sc.RS_CLAIMED_SUCCESS,),
                "confidence": (sc.RS_CONFIDENCE,),
                "decision": (sc.RS_DECISION,),
                "side_effect": (sc.RS_TOOL_SIDE_EFFECT,),
                "shadow_of": (sc.RS_SHADOW_OF,),
                "perturbation_family": (sc.RS_PERTURBATION_FAMILY,),
                "perturbation_strength": (sc.RS_PERTURBATION_STRENGTH,),
                "fault_type": (sc.RS_FAULT_TYPE,),
                "trial_separate": (sc.RS_TRIAL_SEPARATE,),
            },
        ),
    }
)


def names(convention: str, field: str) -> tuple[str, ...]:
    """Attribute names of ``field`` in ``convention``, priority order (KeyError if unknown)."""
    return CONVENTIONS[convention].attrs[field]


# --------------------------------------------------------------------------------------------------
# What the receiver's attribute limits must spare (issue 11: D14, D20)
# --------------------------------------------------------------------------------------------------

# Table fields whose entries are attribute *values*, event names, span-name or scope prefixes, or
# key prefixes rather than attribute keys.
_NOT_KEYS: Final = frozenset({
    "op_handoff", "op_guardrail", "oi_scope", "oi_handoff_name_prefix", "system_value", "scope",
    "sdk_name_value", "scope_prefix", "llm_operations", "user_message_event", "choice_event",
    "evaluation_event", "prompt_event", "input_messages_prefix", "output_messages_prefix",
    "prompt_prefix", "completion_prefix", "lf_trace_name", "lf_task_prefix", "lf_agent_name",
    "lf_turn_prefix", "lf_function_name", "lf_handoff_name", "lf_guardrail_prefix", "lf_model_prefixes",
})
# Table fields holding message / tool content: read by the normalizers, but the bulk a length
# limit is there to cut.
_CONTENT: Final = frozenset({
    "tool_arguments", "tool_result", "input_messages", "output_messages", "tool_call_arguments",
    "input_value", "output_value", "entity_input", "entity_output", "tool_call_args",
    "tool_response", "llm_request", "llm_response", "prompt", "prompt_messages",
    "response_tool_calls", "input", "output", "prompt_event_attr", "lf_input", "lf_output", "lf_events",
})
# Read by the normalizers outside the table (relyscope.collector.normalize.__init__) or by the scorers;
# service.name / service.version: the agent name and version of a root without gen_ai.agent.* (the
# trajectory builder, resource attributes).
_EXTRA_SCORING: Final = ("session.id", "operation.cost", sc.ERROR_TYPE, "exception.type", "exception.message",
                         sc.GEN_AI_SYSTEM_INSTRUCTIONS, "gen_ai.response.id", "gen_ai.agent.description",
                         "service.name", "service.version")


def _keys(want_content: bool | None) -> frozenset[str]:
    out = set()
    for spec in CONVENTIONS.values():
        for fld, keys in spec.attrs.items():
            if fld in _NOT_KEYS:
                continue
            if want_content is None or (fld in _CONTENT) == want_content:
                out.update(keys)
    return frozenset(out)


#: Every attribute key a normalizer or scorer reads (all conventions of :data:`CONVENTIONS`, plus
#: ``session.id``, ``error.type``, ``exception.*``, ``gen_ai.response.id``) and every
#: ``relyscope.*`` key: an attribute *count* limit never drops these.
SCORING_KEYS: Final[frozenset[str]] = _keys(None) | frozenset(_EXTRA_SCORING)
#: The scoring keys that are not message / tool content (ids, names, kinds, models, token counts,
#: outcome): an attribute *length* limit never truncates these (a cut id merges two tasks, D14), and
#: a redaction pattern replaces a secret in them by a keyed token, not one shared mask
#: (:mod:`relyscope.collector.redaction`: a masked id merges two tasks too).
EXACT_KEYS: Final[frozenset[str]] = (_keys(False) | frozenset(_EXTRA_SCORING)) - {
    sc.GEN_AI_SYSTEM_INSTRUCTIONS, "exception.message", "gen_ai.agent.description"}
#: Key prefixes of flattened message history (OpenInference ``llm.input_messages.N.…``, OpenLLMetry
#: ``gen_ai.prompt.N.…``): the first attributes a count limit drops.
HISTORY_PREFIXES: Final = ("llm.input_messages.", "llm.output_messages.", "gen_ai.prompt.",
                           "gen_ai.completion.", "llm.prompts.", "llm.completions.")
_RS_PREFIX: Final = "relyscope."


def attribute_rank(key: str) -> int:
    """Which attributes an attribute-count limit keeps first: 0 — read by scoring (never dropped),
    1 — anything else, 2 — flattened message history (dropped first). Pure."""
    if key in SCORING_KEYS or key.startswith(_RS_PREFIX):
        return 0
    if key.startswith(HISTORY_PREFIXES):
        return 2
    return 1


def never_truncate(key: str) -> bool:
    """Whether an attribute-length limit must leave this key's value whole: identity and other
    exact scoring values (:data:`EXACT_KEYS`, ``relyscope.*``). The one definition of an identity
    key: redaction tokenizes (never masks) and an allow list never drops these
    (:class:`relyscope.collector.redaction.Redactor`). Pure."""
    return key in EXACT_KEYS or key.startswith(_RS_PREFIX)
