"""OpenInference (Arize) conventions: ``openinference.span.kind`` with flattened ``llm.*``,
``tool.*``, ``input.value``/``output.value`` attributes.

AGENT → agent run, TOOL → tool call (``tool.name``, ``input.value`` = arguments, ``output.value``
= result), LLM → model call (``llm.model_name``, ``llm.token_count.*``, ``llm.cost.*``, USD),
CHAIN → workflow step, RETRIEVER/RERANKER → retrieval, EMBEDDING, GUARDRAIL; ``session.id`` →
conversation id. Requested tool calls come from
``llm.output_messages.{i}.message.tool_calls.{j}.tool_call.id``.
"""

from __future__ import annotations

from typing import Any, Final

from relyscope.model import CanonicalSpan, Op

from ._values import (
    as_float,
    as_int,
    as_str,
    decode_json_once,
    first,
    first_user_text,
)
from .versions import CONVENTIONS

__all__ = ["NAME", "SPAN_KINDS", "detect", "extract"]

NAME: Final = "openinference"
_A = CONVENTIONS[NAME].attrs

_KIND = _A["span_kind"][0]
_AGENT_NAME = _A["agent_name"]
_TOOL_NAME = _A["tool_name"]
_TOOL_CALL_ID = _A["tool_call_id"]
_TOOL_CALL_ARGS = _A["tool_call_arguments"]
_INPUT = _A["input_value"]
_OUTPUT = _A["output_value"]
_MODEL = _A["model"]
_PROVIDER = _A["provider"]
_IN = _A["input_tokens"]
_OUT = _A["output_tokens"]
_TOTAL = _A["total_tokens"]
_CACHE_R = _A["cache_read_tokens"]
_CACHE_W = _A["cache_write_tokens"]
_REASON = _A["reasoning_tokens"]
_COST_TOTAL = _A["cost_total"]
_COST_PARTS = _A["cost_parts"]
_SESSION = _A["session_id"]
_IN_PREFIX = _A["input_messages_prefix"][0]
_OUT_PREFIX = _A["output_messages_prefix"][0]
_TOOL_CALL_ID_SUFFIX: Final = ".tool_call.id"

#: ``openinference.span.kind`` value (upper-cased) → Op.
SPAN_KINDS: Final = {
    "AGENT": Op.AGENT,
    "TOOL": Op.TOOL,
    "LLM": Op.LLM,
    "CHAIN": Op.WORKFLOW,
    "RETRIEVER": Op.RETRIEVAL,
    "RERANKER": Op.RETRIEVAL,
    "EMBEDDING": Op.EMBEDDING,
    "GUARDRAIL": Op.GUARDRAIL,
    "EVALUATOR": Op.UNKNOWN,
    "PROMPT": Op.UNKNOWN,
    "UNKNOWN": Op.UNKNOWN,
}


def detect(span: CanonicalSpan) -> bool:
    """True when ``openinference.span.kind`` is present (required on every OpenInference span)."""
    return _KIND in span.attributes


def span_kind(span: CanonicalSpan) -> str | None:
    """The upper-cased ``openinference.span.kind`` value, or None."""
    k = span.attributes.get(_KIND)
    return k.strip().upper() if isinstance(k, str) else None


def _index(s: str) -> int:
    return int(s) if s.isdigit() else 1 << 30


def _input_messages_user_text(a: Any) -> str | None:
    """First user message text of ``llm.input_messages.{i}.message.*`` (content or contents)."""
    roles: list[tuple[int, str]] = []
    for k in a:
        if k.startswith(_IN_PREFIX) and k.endswith(".message.role"):
            idx = k[len(_IN_PREFIX) : -len(".message.role")]
            roles.append((_index(idx), idx))
    for _, idx in sorted(roles):
        base = f"{_IN_PREFIX}{idx}.message."
        if a.get(base + "role") not in ("user", "human"):
            continue
        content = a.get(base + "content")
        if isinstance(content, str) and content:
            return content
        texts = []
        for j in range(64):
            t = a.get(f"{base}contents.{j}.message_content.text")
            if t is None and f"{base}contents.{j}.message_content.type" not in a:
                break
            if isinstance(t, str) and t:
                texts.append(t)
        if texts:
            return "\n".join(texts)
    return None


def _requested_tool_calls(a: Any) -> tuple[str, ...]:
    found: list[tuple[int, int, str]] = []
    for k, v in a.items():
        if k.startswith(_OUT_PREFIX) and k.endswith(_TOOL_CALL_ID_SUFFIX):
            # llm.output_messages.{i}.message.tool_calls.{j}.tool_call.id
            parts = k[len(_OUT_PREFIX) : -len(_TOOL_CALL_ID_SUFFIX)].split(".")
            s = as_str(v)
            if s and len(parts) == 4:
                found.append((_index(parts[0]), _index(parts[3]), s))
    return tuple(dict.fromkeys(s for _, _, s in sorted(found)))


def _text_input(value: Any) -> str | None:
    """A task's text from ``input.value``: the first user message if it holds messages, the
    string itself if it is plain text (or JSON of a string), else the raw string."""
    if not isinstance(value, str) or not value:
        return None
    decoded = decode_json_once(value)
    if isinstance(decoded, str):
        return decoded or None
    return first_user_text(decoded) or value


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields found in OpenInference attributes (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {}
    kind = span_kind(span)
    op = SPAN_KINDS.get(kind) if kind else None
    if op is not None:
        out["op"] = op
    out["agent_name"] = as_str(first(a, _AGENT_NAME))
    out["conversation_id"] = as_str(first(a, _SESSION))
    if op is Op.TOOL:
        out["tool_name"] = as_str(first(a, _TOOL_NAME))
        out["tool_call_id"] = as_str(first(a, _TOOL_CALL_ID))
        args = first(a, _INPUT)
        if args is None:
            args = first(a, _TOOL_CALL_ARGS)
        out["tool_arguments"] = decode_json_once(args)
        out["tool_result"] = decode_json_once(first(a, _OUTPUT))
        return out
    out["model"] = as_str(first(a, _MODEL))
    out["provider"] = as_str(first(a, _PROVIDER))
    out["input_tokens"] = as_int(first(a, _IN))
    out["output_tokens"] = as_int(first(a, _OUT))
    out["total_tokens"] = as_int(first(a, _TOTAL))
    out["cache_read_tokens"] = as_int(first(a, _CACHE_R))
    out["cache_write_tokens"] = as_int(first(a, _CACHE_W))
    out["reasoning_tokens"] = as_int(first(a, _REASON))
    cost = as_float(first(a, _COST_TOTAL))
    if cost is None:
        parts = [c for c in (as_float(a.get(k)) for k in _COST_PARTS) if c is not None]
        cost = sum(parts) if parts else None
    out["cost_usd"] = cost
    if op is Op.LLM:
        out["first_user_input"] = _input_messages_user_text(a) or _text_input(first(a, _INPUT))
        requested = _requested_tool_calls(a)
        if requested:
            out["requested_tool_calls"] = requested
    elif op in (Op.AGENT, Op.WORKFLOW, None):
        out["first_user_input"] = _text_input(first(a, _INPUT))
    return out
