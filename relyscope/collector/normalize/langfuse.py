"""Langfuse SDK OTel attributes (``langfuse.observation.*``).

``langfuse.observation.type``: generation → model call, agent, tool, chain → workflow, retriever,
embedding, guardrail; ``span``/``event``/``evaluator`` → unknown. Model from
``langfuse.observation.model.name``; tokens from the JSON ``usage_details``; cost (USD) from the
JSON ``cost_details`` (its ``total``, else the sum of its entries, as Langfuse computes it);
level ERROR → error. Agent and tool observations are named by the span name.
"""

from __future__ import annotations

from typing import Any, Final, Mapping

from relyscope.model import CanonicalSpan, Op

from ._values import as_float, as_int, as_str, decode_json_once, first, first_user_text
from .versions import CONVENTIONS

__all__ = ["NAME", "OBSERVATION_TYPES", "detect", "extract"]

NAME: Final = "langfuse"
_A = CONVENTIONS[NAME].attrs

_TYPE = _A["type"][0]
_LEVEL = _A["level"]
_STATUS = _A["status_message"]
_INPUT = _A["input"]
_OUTPUT = _A["output"]
_MODEL = _A["model"]
_USAGE = _A["usage_details"]
_COST = _A["cost_details"]
_SESSION = _A["session_id"]

#: ``langfuse.observation.type`` value → Op.
OBSERVATION_TYPES: Final = {
    "generation": Op.LLM,
    "agent": Op.AGENT,
    "tool": Op.TOOL,
    "chain": Op.WORKFLOW,
    "retriever": Op.RETRIEVAL,
    "embedding": Op.EMBEDDING,
    "guardrail": Op.GUARDRAIL,
    "span": Op.UNKNOWN,
    "event": Op.UNKNOWN,
    "evaluator": Op.UNKNOWN,
}

# usage_details key → SpanSemantics field (OpenAI-, Anthropic- and Langfuse-style keys)
_USAGE_KEYS: Final = {
    "input": "input_tokens",
    "input_tokens": "input_tokens",
    "prompt_tokens": "input_tokens",
    "output": "output_tokens",
    "output_tokens": "output_tokens",
    "completion_tokens": "output_tokens",
    "total": "total_tokens",
    "total_tokens": "total_tokens",
    "cache_read_input_tokens": "cache_read_tokens",
    "input_cache_read": "cache_read_tokens",
    "input_cached_tokens": "cache_read_tokens",
    "cache_creation_input_tokens": "cache_write_tokens",
    "input_cache_creation": "cache_write_tokens",
    "reasoning_tokens": "reasoning_tokens",
    "output_reasoning_tokens": "reasoning_tokens",
    "output_reasoning": "reasoning_tokens",
}


def detect(span: CanonicalSpan) -> bool:
    """True when ``langfuse.observation.type`` is present."""
    return _TYPE in span.attributes


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields of a Langfuse span (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {"conversation_id": as_str(first(a, _SESSION))}
    otype = a.get(_TYPE)
    op = OBSERVATION_TYPES.get(otype.strip().lower()) if isinstance(otype, str) else None
    if op is not None:
        out["op"] = op
    level = first(a, _LEVEL)
    if isinstance(level, str) and level.upper() == "ERROR":
        out["error_type"] = as_str(first(a, _STATUS)) or "error"
    if op is Op.TOOL:
        out["tool_name"] = span.name or None
        out["tool_arguments"] = decode_json_once(first(a, _INPUT))
        out["tool_result"] = decode_json_once(first(a, _OUTPUT))
        return out
    if op is Op.AGENT:
        out["agent_name"] = span.name or None
    out["model"] = as_str(first(a, _MODEL))
    usage = decode_json_once(first(a, _USAGE))
    if isinstance(usage, Mapping):
        for key, fld in _USAGE_KEYS.items():
            if out.get(fld) is None and key in usage:
                out[fld] = as_int(usage[key])
    cost = decode_json_once(first(a, _COST))
    if isinstance(cost, Mapping):
        total = as_float(cost.get("total"))
        if total is None:
            parts = [c for c in (as_float(v) for v in cost.values()) if c is not None]
            total = sum(parts) if parts else None
        out["cost_usd"] = total
    if op in (Op.LLM, Op.AGENT, Op.WORKFLOW):
        inp = first(a, _INPUT)
        if inp is not None:
            decoded = decode_json_once(inp)
            out["first_user_input"] = (
                decoded if isinstance(decoded, str) and decoded else first_user_text(decoded)
            )
    return out
