"""OpenAI Agents SDK spans through its OTel bridges: handoffs and guardrails.

- contrib ``opentelemetry-instrumentation-openai-agents-v2``: ``gen_ai.operation.name`` =
  ``agent_handoff`` (``gen_ai.handoff.to_agent``/``from_agent``) or ``guardrail_check``
  (``gen_ai.guardrail.name``, ``gen_ai.guardrail.triggered``); its other spans are plain GenAI.
- OpenInference ``openinference-instrumentation-openai-agents``: a handoff is a TOOL span named
  ``handoff to <agent>``; agent spans are AGENT spans named after the agent. (That bridge does not
  export a guardrail's ``triggered`` flag; its guardrail spans are CHAIN spans.)
- Logfire's integration: span-data fields as attributes (``type`` = handoff with ``to_agent``;
  ``type`` = guardrail with ``name``/``triggered``).

Handoff spans → ``Op.HANDOFF`` with ``handoff_target``; guardrail spans → ``Op.GUARDRAIL`` with
``guardrail_triggered`` (the dispatcher turns a trigger into decision ``refuse``).
"""

from __future__ import annotations

from typing import Any, Final

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan, Op

from ._values import as_bool, as_str, first
from .versions import CONVENTIONS

__all__ = ["NAME", "detect", "extract"]

NAME: Final = "openai_agents"
_A = CONVENTIONS[NAME].attrs

_OP_HANDOFF = _A["op_handoff"][0]
_OP_GUARDRAIL = _A["op_guardrail"][0]
_HANDOFF_TO = _A["handoff_to"]
_GUARDRAIL_NAME = _A["guardrail_name"]
_GUARDRAIL_TRIGGERED = _A["guardrail_triggered"]
_OI_SCOPE = _A["oi_scope"][0]
_OI_HANDOFF_PREFIX = _A["oi_handoff_name_prefix"][0]
_LF_TYPE = _A["logfire_type"][0]
_LF_TO = _A["logfire_to_agent"]
_LF_TRIGGERED = _A["logfire_triggered"]
_LF_NAME = _A["logfire_name"]
_OPERATION = sc.GEN_AI_OPERATION_NAME
_OI_KIND = CONVENTIONS["openinference"].attrs["span_kind"][0]


def detect(span: CanonicalSpan) -> bool:
    """True for a span of one of the OpenAI Agents bridges that this module refines."""
    a = span.attributes
    op = a.get(_OPERATION)
    if op == _OP_HANDOFF or op == _OP_GUARDRAIL:
        return True
    if _HANDOFF_TO[0] in a or _GUARDRAIL_TRIGGERED[0] in a:
        return True
    if span.scope_name == _OI_SCOPE:
        return True
    t = a.get(_LF_TYPE)
    return (t == "handoff" and _LF_TO[0] in a) or (t == "guardrail" and _LF_TRIGGERED[0] in a)


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """Handoff / guardrail / agent-name fields of an OpenAI Agents span (absent fields omitted)."""
    a = span.attributes
    out: dict[str, Any] = {}
    op = a.get(_OPERATION)
    lf_type = a.get(_LF_TYPE)
    if op == _OP_HANDOFF or _HANDOFF_TO[0] in a:
        out["op"] = Op.HANDOFF
        out["handoff_target"] = as_str(first(a, _HANDOFF_TO))
    elif op == _OP_GUARDRAIL or _GUARDRAIL_TRIGGERED[0] in a:
        out["op"] = Op.GUARDRAIL
        out["guardrail_triggered"] = as_bool(first(a, _GUARDRAIL_TRIGGERED))
    elif lf_type == "handoff" and _LF_TO[0] in a:
        out["op"] = Op.HANDOFF
        out["handoff_target"] = as_str(first(a, _LF_TO))
    elif lf_type == "guardrail" and _LF_TRIGGERED[0] in a:
        out["op"] = Op.GUARDRAIL
        out["guardrail_triggered"] = as_bool(first(a, _LF_TRIGGERED))
    elif span.scope_name == _OI_SCOPE:
        kind = a.get(_OI_KIND)
        if kind == "TOOL" and span.name.startswith(_OI_HANDOFF_PREFIX):
            out["op"] = Op.HANDOFF
            out["handoff_target"] = span.name[len(_OI_HANDOFF_PREFIX) :].strip() or None
        elif kind == "AGENT" and span.parent_span_id:
            # the bridge names agent spans after the agent; its parentless trace root is named
            # after the workflow, so it gets no agent name
            out["agent_name"] = span.name or None
    return out
