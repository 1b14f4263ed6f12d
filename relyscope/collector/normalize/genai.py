"""OpenTelemetry GenAI semantic conventions, current (post May-2026 move) and pre-move names.

``gen_ai.system`` ≡ ``gen_ai.provider.name``; ``gen_ai.usage.prompt_tokens``/``completion_tokens``
≡ ``input_tokens``/``output_tokens``; ``cache_creation`` ≡ ``cache_write``. Message content is read
from ``gen_ai.input.messages``/``gen_ai.output.messages`` (JSON string or list, structured parts or
plain ``content``) and, for pre-2025 emitters, from ``gen_ai.user.message``/``gen_ai.choice``
events.
"""

from __future__ import annotations

from typing import Any, Final

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan, Op

from ._values import (
    as_bool,
    as_int,
    as_str,
    as_str_tuple,
    decode_json_once,
    first,
    first_user_text,
    message_text,
    requested_call_ids,
    requested_calls,
)
from .versions import CONVENTIONS

__all__ = ["NAME", "OPERATIONS", "detect", "extract"]

NAME: Final = "genai"
_A = CONVENTIONS[NAME].attrs

_OPERATION = _A["operation"]
_PROVIDER = _A["provider"]
_AGENT_NAME = _A["agent_name"]
_AGENT_ID = _A["agent_id"]
_AGENT_VERSION = _A["agent_version"]
_CONVERSATION_ID = _A["conversation_id"]
_IS_NESTED = _A["is_nested"]
_REQUEST_MODEL = _A["request_model"]
_RESPONSE_MODEL = _A["response_model"]
_FINISH = _A["finish_reasons"]
_IN = _A["input_tokens"]
_OUT = _A["output_tokens"]
_CACHE_R = _A["cache_read_tokens"]
_CACHE_W = _A["cache_write_tokens"]
_REASON = _A["reasoning_tokens"]
_TOTAL = _A["total_tokens"]
_TOOL_NAME = _A["tool_name"]
_TOOL_CALL_ID = _A["tool_call_id"]
_TOOL_TYPE = _A["tool_type"]
_TOOL_ARGS = _A["tool_arguments"]
_TOOL_RESULT = _A["tool_result"]
_IN_MSGS = _A["input_messages"]
_OUT_MSGS = _A["output_messages"]
_USER_EVENT = _A["user_message_event"][0]
_CHOICE_EVENT = _A["choice_event"][0]

#: ``gen_ai.operation.name`` value → Op. ``create_agent`` is not a step: explicitly UNKNOWN.
OPERATIONS: Final = {
    sc.OP_INVOKE_AGENT: Op.AGENT,
    sc.OP_CREATE_AGENT: Op.UNKNOWN,
    sc.OP_INVOKE_WORKFLOW: Op.WORKFLOW,
    sc.OP_HANDLE_TURN: Op.WORKFLOW,
    sc.OP_CHAT: Op.LLM,
    sc.OP_TEXT_COMPLETION: Op.LLM,
    sc.OP_GENERATE_CONTENT: Op.LLM,
    sc.OP_EMBEDDINGS: Op.EMBEDDING,
    sc.OP_EXECUTE_TOOL: Op.TOOL,
    "retrieval": Op.RETRIEVAL,
}

# Any of these keys marks a span as (partly) GenAI semconv.
_MARKERS: Final = (
    _OPERATION
    + _PROVIDER
    + _AGENT_NAME
    + _REQUEST_MODEL
    + _RESPONSE_MODEL
    + _TOOL_NAME
    + _IN
    + _OUT
    + _IN_MSGS
    + _CONVERSATION_ID
)


def detect(span: CanonicalSpan) -> bool:
    """True when the span carries a GenAI semconv key, or legacy GenAI message events."""
    a = span.attributes
    for k in _MARKERS:
        if k in a:
            return True
    for e in span.events:
        if e.name == _USER_EVENT or e.name == _CHOICE_EVENT:
            return True
    return False


def output_message_fields(out_msgs: Any,
                          finish: tuple[str, ...]) -> tuple[tuple[str, ...], Any, tuple[str, ...]]:
    """From ``gen_ai.output.messages`` (JSON text or a decoded list): the tool-call ids the
    model requested, the requested calls, and the finish reasons — ``finish`` when the span's
    attribute gave any, else those of the messages. Shared with the fast normalizer."""
    decoded = decode_json_once(out_msgs)
    if not finish and isinstance(decoded, list):
        finish = tuple(r for m in decoded
                       if isinstance(m, dict) and isinstance(r := m.get("finish_reason"), str) and r)
    return requested_call_ids(decoded), requested_calls(decoded), finish


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields found in GenAI semconv attributes/events (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {}
    op_name = a.get(_OPERATION[0])
    if isinstance(op_name, str):
        op = OPERATIONS.get(op_name.strip().lower())
        if op is not None:
            out["op"] = op
    out["agent_name"] = as_str(first(a, _AGENT_NAME))
    out["agent_id"] = as_str(first(a, _AGENT_ID))
    out["agent_version"] = as_str(first(a, _AGENT_VERSION))
    out["is_nested"] = as_bool(first(a, _IS_NESTED))
    out["conversation_id"] = as_str(first(a, _CONVERSATION_ID))
    out["provider"] = as_str(first(a, _PROVIDER))
    out["model"] = as_str(first(a, _RESPONSE_MODEL)) or as_str(first(a, _REQUEST_MODEL))
    out["tool_name"] = as_str(first(a, _TOOL_NAME))
    out["tool_call_id"] = as_str(first(a, _TOOL_CALL_ID))
    out["tool_type"] = as_str(first(a, _TOOL_TYPE))
    out["tool_arguments"] = decode_json_once(first(a, _TOOL_ARGS))
    out["tool_result"] = decode_json_once(first(a, _TOOL_RESULT))
    out["input_tokens"] = as_int(first(a, _IN))
    out["output_tokens"] = as_int(first(a, _OUT))
    out["cache_read_tokens"] = as_int(first(a, _CACHE_R))
    out["cache_write_tokens"] = as_int(first(a, _CACHE_W))
    out["reasoning_tokens"] = as_int(first(a, _REASON))
    out["total_tokens"] = as_int(first(a, _TOTAL))
    finish = as_str_tuple(first(a, _FINISH))

    in_msgs = first(a, _IN_MSGS)
    if in_msgs is not None:
        out["first_user_input"] = first_user_text(in_msgs)
    out_msgs = first(a, _OUT_MSGS)
    requested: tuple[str, ...] = ()
    if out_msgs is not None:
        requested, calls, finish = output_message_fields(out_msgs, finish)
        if calls:
            out["requested_tools"] = calls

    # pre-2025 event-carried content (Semantic Kernel 1.55, Strands, early contrib instrumentations)
    if span.events:
        ev_finish: list[str] = []
        ev_requested: list[str] = []
        for e in span.events:
            if e.name == _USER_EVENT:
                if out.get("first_user_input") is None:
                    out["first_user_input"] = message_text(
                        {"content": decode_json_once(e.attributes.get("content"))}
                    )
            elif e.name == _CHOICE_EVENT:
                r = e.attributes.get("finish_reason")
                if isinstance(r, str) and r:
                    ev_finish.append(r)
                msg = decode_json_once(e.attributes.get("message"))
                if isinstance(msg, dict):
                    ev_requested.extend(requested_call_ids(msg))
                calls = decode_json_once(e.attributes.get("tool_calls"))
                if isinstance(calls, list):
                    ev_requested.extend(requested_call_ids({"tool_calls": calls}))
        if not finish:
            finish = tuple(ev_finish)
        if not requested:
            requested = tuple(dict.fromkeys(ev_requested))
    if finish:
        out["finish_reasons"] = finish
    if requested:
        out["requested_tool_calls"] = requested
    return out
