"""OpenLLMetry (Traceloop) conventions.

``traceloop.span.kind`` workflow | task | agent | tool with ``traceloop.entity.name`` and
JSON ``traceloop.entity.input``/``output``; model calls carry ``llm.request.type``,
``llm.usage.total_tokens`` and flattened ``gen_ai.prompt.{i}.*`` / ``gen_ai.completion.{i}.*``
messages (its ``gen_ai.usage.*``/``gen_ai.system`` keys are read by :mod:`.genai`).
``traceloop.association.properties.session_id`` → conversation id.
"""

from __future__ import annotations

from typing import Any, Final, Mapping

from relyscope.model import CanonicalSpan, Op

from ._values import as_int, as_str, decode_json_once, first, message_text
from .versions import CONVENTIONS

__all__ = ["NAME", "SPAN_KINDS", "REQUEST_TYPES", "detect", "extract"]

NAME: Final = "openllmetry"
_A = CONVENTIONS[NAME].attrs

_KIND = _A["span_kind"][0]
_ENTITY = _A["entity_name"]
_ENTITY_IN = _A["entity_input"]
_ENTITY_OUT = _A["entity_output"]
_SESSION = _A["session_id"]
_REQUEST_TYPE = _A["request_type"][0]
_TOTAL = _A["total_tokens"]
_PROMPT = _A["prompt_prefix"][0]
_COMPLETION = _A["completion_prefix"][0]
_MAX_MESSAGES: Final = 1000  # bound on flattened message indexes scanned

#: ``traceloop.span.kind`` value → Op.
SPAN_KINDS: Final = {
    "workflow": Op.WORKFLOW,
    "task": Op.WORKFLOW,
    "agent": Op.AGENT,
    "tool": Op.TOOL,
}
#: ``llm.request.type`` value → Op.
REQUEST_TYPES: Final = {
    "chat": Op.LLM,
    "completion": Op.LLM,
    "embedding": Op.EMBEDDING,
    "rerank": Op.RETRIEVAL,
}

_MARKERS: Final = (
    _KIND,
    _ENTITY[0],
    _REQUEST_TYPE,
    _TOTAL[0],
    _SESSION[0],
    _PROMPT + "0.role",
    _PROMPT + "0.content",
    _COMPLETION + "0.role",
    _COMPLETION + "0.content",
)


def detect(span: CanonicalSpan) -> bool:
    """True when a Traceloop/OpenLLMetry key is present."""
    a = span.attributes
    for k in _MARKERS:
        if k in a:
            return True
    return False


def _unwrap_entity_input(value: Any) -> Any:
    """OpenLLMetry serializes a decorated function's call as ``{"args": [...], "kwargs": {...}}``;
    with no positional args the tool's arguments are the kwargs."""
    if isinstance(value, Mapping) and set(value) <= {"args", "kwargs"} and "kwargs" in value:
        if not value.get("args"):
            return value["kwargs"]
    return value


def _first_user_prompt(a: Mapping[str, Any]) -> str | None:
    for i in range(_MAX_MESSAGES):
        role = a.get(f"{_PROMPT}{i}.role")
        content = a.get(f"{_PROMPT}{i}.content")
        if role is None and content is None:
            return None
        if role == "user":
            text = message_text({"content": decode_json_once(content)})
            if text:
                return text
    return None


def _completions(a: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    finish: list[str] = []
    requested: list[str] = []
    for i in range(_MAX_MESSAGES):
        base = f"{_COMPLETION}{i}."
        reason = a.get(base + "finish_reason")
        if reason is None and base + "role" not in a and base + "content" not in a:
            if base + "tool_calls.0.id" not in a:
                break
        if isinstance(reason, str) and reason:
            finish.append(reason)
        for j in range(_MAX_MESSAGES):
            cid = as_str(a.get(f"{base}tool_calls.{j}.id"))
            if cid is None:
                break
            if cid not in requested:
                requested.append(cid)
    return tuple(finish), tuple(requested)


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields found in OpenLLMetry attributes (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {}
    kind = a.get(_KIND)
    op = SPAN_KINDS.get(kind.strip().lower()) if isinstance(kind, str) else None
    if op is None:
        rtype = a.get(_REQUEST_TYPE)
        op = REQUEST_TYPES.get(rtype.strip().lower()) if isinstance(rtype, str) else None
    if op is not None:
        out["op"] = op
    out["conversation_id"] = as_str(first(a, _SESSION))
    entity = as_str(first(a, _ENTITY))
    if op is Op.TOOL:
        out["tool_name"] = entity
        out["tool_arguments"] = _unwrap_entity_input(decode_json_once(first(a, _ENTITY_IN)))
        out["tool_result"] = decode_json_once(first(a, _ENTITY_OUT))
        return out
    if op is Op.AGENT:
        out["agent_name"] = entity
    out["total_tokens"] = as_int(first(a, _TOTAL))
    if op is Op.LLM or _PROMPT + "0.role" in a or _PROMPT + "0.content" in a:
        out["first_user_input"] = _first_user_prompt(a)
        finish, requested = _completions(a)
        if finish:
            out["finish_reasons"] = finish
        if requested:
            out["requested_tool_calls"] = requested
    return out
