"""Vercel AI SDK ``ai.*`` telemetry (SDK 4–5). SDK v7 emits GenAI semconv, read by :mod:`.genai`.

``ai.operationId``: ``ai.generateText``/``ai.streamText``/``ai.generateObject``/``ai.streamObject``
(a multi-step call loop) → workflow, their ``.doGenerate``/``.doStream`` → model call,
``ai.toolCall`` → tool call, ``ai.embed``/``ai.embedMany`` (and ``.doEmbed``) → embedding.
"""

from __future__ import annotations

from typing import Any, Final

from relyscope.model import CanonicalSpan, Op

from ._values import (
    as_int,
    as_str,
    decode_json_once,
    first,
    first_user_text,
    requested_calls,
)
from .versions import CONVENTIONS

__all__ = ["NAME", "OPERATIONS", "detect", "extract"]

NAME: Final = "vercel_ai"
_A = CONVENTIONS[NAME].attrs

_OPERATION_ID = _A["operation_id"][0]
_TOOL_NAME = _A["tool_name"]
_TOOL_CALL_ID = _A["tool_call_id"]
_TOOL_ARGS = _A["tool_arguments"]
_TOOL_RESULT = _A["tool_result"]
_MODEL = _A["model"]
_PROVIDER = _A["provider"]
_IN = _A["input_tokens"]
_OUT = _A["output_tokens"]
_TOTAL = _A["total_tokens"]
_REASON = _A["reasoning_tokens"]
_CACHE_R = _A["cache_read_tokens"]
_FINISH = _A["finish_reason"]
_PROMPT = _A["prompt"]
_PROMPT_MESSAGES = _A["prompt_messages"]
_RESPONSE_TOOL_CALLS = _A["response_tool_calls"]

#: ``ai.operationId`` value → Op.
OPERATIONS: Final = {
    "ai.generateText": Op.WORKFLOW,
    "ai.streamText": Op.WORKFLOW,
    "ai.generateObject": Op.WORKFLOW,
    "ai.streamObject": Op.WORKFLOW,
    "ai.generateText.doGenerate": Op.LLM,
    "ai.streamText.doStream": Op.LLM,
    "ai.generateObject.doGenerate": Op.LLM,
    "ai.streamObject.doStream": Op.LLM,
    "ai.toolCall": Op.TOOL,
    "ai.embed": Op.EMBEDDING,
    "ai.embedMany": Op.EMBEDDING,
    "ai.embed.doEmbed": Op.EMBEDDING,
    "ai.embedMany.doEmbed": Op.EMBEDDING,
}


def detect(span: CanonicalSpan) -> bool:
    """True when ``ai.operationId`` or ``ai.toolCall.name`` is present."""
    a = span.attributes
    return _OPERATION_ID in a or _TOOL_NAME[0] in a


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields of a Vercel AI SDK ``ai.*`` span (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {}
    op = OPERATIONS.get(a.get(_OPERATION_ID))  # type: ignore[arg-type]
    if op is None and _TOOL_NAME[0] in a:
        op = Op.TOOL
    if op is not None:
        out["op"] = op
    if op is Op.TOOL:
        out["tool_name"] = as_str(first(a, _TOOL_NAME))
        out["tool_call_id"] = as_str(first(a, _TOOL_CALL_ID))
        out["tool_arguments"] = decode_json_once(first(a, _TOOL_ARGS))
        out["tool_result"] = decode_json_once(first(a, _TOOL_RESULT))
        return out
    out["model"] = as_str(first(a, _MODEL))
    out["provider"] = as_str(first(a, _PROVIDER))
    out["input_tokens"] = as_int(first(a, _IN))
    out["output_tokens"] = as_int(first(a, _OUT))
    out["total_tokens"] = as_int(first(a, _TOTAL))
    out["reasoning_tokens"] = as_int(first(a, _REASON))
    out["cache_read_tokens"] = as_int(first(a, _CACHE_R))
    reason = as_str(first(a, _FINISH))
    if reason:
        out["finish_reasons"] = (reason,)
    msgs = first(a, _PROMPT_MESSAGES)
    text = first_user_text(msgs) if msgs is not None else None
    if text is None:
        prompt = decode_json_once(first(a, _PROMPT))
        if isinstance(prompt, dict):
            p = prompt.get("prompt")
            text = p if isinstance(p, str) and p else first_user_text(prompt)
    out["first_user_input"] = text
    calls = decode_json_once(first(a, _RESPONSE_TOOL_CALLS))
    if isinstance(calls, list):
        ids = tuple(
            dict.fromkeys(
                s for c in calls if isinstance(c, dict) and (s := as_str(c.get("toolCallId")))
            )
        )
        if ids:
            out["requested_tool_calls"] = ids
            out["requested_tools"] = requested_calls(calls) or None
    return out


