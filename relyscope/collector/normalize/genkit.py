"""Firebase Genkit (``genkit:*`` attributes holding JSON input/output).

``genkit:metadata:subtype`` model → model call (``genkit:name`` = ``provider/model``; usage and
``finishReason`` from ``genkit:output``), tool → tool call (``genkit:input``/``genkit:output`` =
arguments/result), embedder → embedding, retriever → retrieval; ``genkit:type`` flow → workflow.
"""

from __future__ import annotations

from typing import Any, Final, Mapping

from relyscope.model import CanonicalSpan, Op

from ._values import (
    as_int,
    as_str,
    decode_json_once,
    first,
    first_user_text,
    requested_call_ids,
)
from .versions import CONVENTIONS

__all__ = ["NAME", "SUBTYPES", "detect", "extract"]

NAME: Final = "genkit"
_A = CONVENTIONS[NAME].attrs

_TYPE = _A["type"][0]
_SUBTYPE = _A["subtype"][0]
_NAME = _A["name"]
_INPUT = _A["input"]
_OUTPUT = _A["output"]
_SESSION = _A["session_id"]

#: ``genkit:metadata:subtype`` value → Op.
SUBTYPES: Final = {
    "model": Op.LLM,
    "tool": Op.TOOL,
    "embedder": Op.EMBEDDING,
    "retriever": Op.RETRIEVAL,
    "flow": Op.WORKFLOW,
}


def detect(span: CanonicalSpan) -> bool:
    """True when ``genkit:type`` or ``genkit:name`` is present."""
    a = span.attributes
    return _TYPE in a or _NAME[0] in a


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields of a Genkit span (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {"conversation_id": as_str(first(a, _SESSION))}
    subtype = a.get(_SUBTYPE)
    op = SUBTYPES.get(subtype) if isinstance(subtype, str) else None
    if op is None and a.get(_TYPE) == "flow":
        op = Op.WORKFLOW
    if op is not None:
        out["op"] = op
    name = as_str(first(a, _NAME))
    if op is Op.TOOL:
        out["tool_name"] = name
        out["tool_arguments"] = decode_json_once(first(a, _INPUT))
        out["tool_result"] = decode_json_once(first(a, _OUTPUT))
        return out
    if op is not Op.LLM:
        return out
    if name:
        provider, sep, model = name.partition("/")
        out["model"] = model if sep and model else name
        out["provider"] = provider if sep and model else None
    request = decode_json_once(first(a, _INPUT))
    if isinstance(request, Mapping):
        out["first_user_input"] = first_user_text(request)
    response = decode_json_once(first(a, _OUTPUT))
    if isinstance(response, Mapping):
        usage = response.get("usage")
        if isinstance(usage, Mapping):
            out["input_tokens"] = as_int(usage.get("inputTokens"))
            out["output_tokens"] = as_int(usage.get("outputTokens"))
            out["total_tokens"] = as_int(usage.get("totalTokens"))
            out["reasoning_tokens"] = as_int(usage.get("thoughtsTokens"))
            out["cache_read_tokens"] = as_int(usage.get("cachedContentTokens"))
        reason = response.get("finishReason")
        if isinstance(reason, str) and reason:
            out["finish_reasons"] = (reason,)
        message = response.get("message")
        if isinstance(message, Mapping):
            requested = requested_call_ids(message)
            if requested:
                out["requested_tool_calls"] = requested
    return out
