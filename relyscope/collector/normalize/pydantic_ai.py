"""Pydantic AI through Logfire instrumentation (``InstrumentationSettings`` version 1).

Tool spans carry ``gen_ai.tool.name``/``gen_ai.tool.call.id`` (read by :mod:`.genai`) and the
call as ``tool_arguments`` (JSON string) / ``tool_response``; the agent-run span carries
``agent_name`` and ``model_name``.
"""

from __future__ import annotations

from typing import Any, Final

from relyscope.model import CanonicalSpan, Op

from ._values import as_str, decode_json_once, first
from .versions import CONVENTIONS

__all__ = ["NAME", "detect", "extract"]

NAME: Final = "pydantic_ai"
_A = CONVENTIONS[NAME].attrs

_ARGS = _A["tool_arguments"]
_RESPONSE = _A["tool_response"]
_AGENT_NAME = _A["agent_name"]
_MODEL_NAME = _A["model_name"]
_LOGFIRE = _A["logfire_msg"]
_SCOPE = _A["scope"][0]


def detect(span: CanonicalSpan) -> bool:
    """True for spans of the ``pydantic-ai`` scope, or Logfire spans with pydantic-ai keys."""
    if span.scope_name == _SCOPE:
        return True
    a = span.attributes
    if _LOGFIRE[0] in a or _LOGFIRE[1] in a:
        return _ARGS[0] in a or _AGENT_NAME[0] in a
    return False


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """SpanSemantics fields of a Pydantic AI span (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {}
    if _ARGS[0] in a or _RESPONSE[0] in a:
        out["op"] = Op.TOOL
        out["tool_arguments"] = decode_json_once(first(a, _ARGS))
        out["tool_result"] = decode_json_once(first(a, _RESPONSE))
    elif _AGENT_NAME[0] in a:
        out["op"] = Op.AGENT
        out["agent_name"] = as_str(first(a, _AGENT_NAME))
        out["model"] = as_str(first(a, _MODEL_NAME))
    return out
