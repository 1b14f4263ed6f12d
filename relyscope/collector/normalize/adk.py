"""Google Agent Development Kit (ADK) native attributes (``gcp.vertex.agent.*``).

ADK emits GenAI semconv (read by :mod:`.genai`) plus JSON copies of the tool call and of the model
request/response: tool arguments ``gcp.vertex.agent.tool_call_args``, result
``gcp.vertex.agent.tool_response``, ``llm_request.contents`` (first user text) and
``llm_response.content.parts[].function_call.id`` (requested tool calls),
``gcp.vertex.agent.session_id`` → conversation id.
"""

from __future__ import annotations

from typing import Any, Final, Mapping

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan

from ._values import (
    as_int,
    as_str,
    decode_json_once,
    first,
    first_user_text,
    requested_call_ids,
)
from .versions import CONVENTIONS

__all__ = ["NAME", "detect", "extract"]

NAME: Final = "adk"
_A = CONVENTIONS[NAME].attrs

_SYSTEM_VALUE = _A["system_value"][0]
_ARGS = _A["tool_call_args"]
_RESPONSE = _A["tool_response"]
_LLM_REQUEST = _A["llm_request"]
_LLM_RESPONSE = _A["llm_response"]
_SESSION = _A["session_id"]
_MARKERS: Final = (
    _ARGS[0],
    _RESPONSE[0],
    _LLM_REQUEST[0],
    _LLM_RESPONSE[0],
    _A["invocation_id"][0],
    _A["event_id"][0],
)


def detect(span: CanonicalSpan) -> bool:
    """True when a ``gcp.vertex.agent.*`` key is present or the GenAI system is ADK's."""
    a = span.attributes
    for k in _MARKERS:
        if k in a:
            return True
    return a.get(sc.GEN_AI_SYSTEM) == _SYSTEM_VALUE


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields from ADK's native attributes (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {
        "tool_arguments": decode_json_once(first(a, _ARGS)),
        "tool_result": decode_json_once(first(a, _RESPONSE)),
        "conversation_id": as_str(first(a, _SESSION)),
    }
    request = decode_json_once(first(a, _LLM_REQUEST))
    if isinstance(request, Mapping):
        out["first_user_input"] = first_user_text(request)
    response = decode_json_once(first(a, _LLM_RESPONSE))
    if isinstance(response, Mapping):
        content = response.get("content")
        if isinstance(content, Mapping):
            requested = requested_call_ids(content)
            if requested:
                out["requested_tool_calls"] = requested
        usage = response.get("usage_metadata")
        if isinstance(usage, Mapping):
            out["input_tokens"] = as_int(usage.get("prompt_token_count"))
            out["output_tokens"] = as_int(usage.get("candidates_token_count"))
            out["total_tokens"] = as_int(usage.get("total_token_count"))
            out["reasoning_tokens"] = as_int(usage.get("thoughts_token_count"))
            out["cache_read_tokens"] = as_int(usage.get("cached_content_token_count"))
        reason = response.get("finish_reason")
        if isinstance(reason, str) and reason:
            out["finish_reasons"] = (reason,)
    return out
