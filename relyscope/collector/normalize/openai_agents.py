"""OpenAI Agents SDK spans through its OTel bridges: handoffs and guardrails.

- contrib ``opentelemetry-instrumentation-openai-agents-v2``: ``gen_ai.operation.name`` =
  ``agent_handoff`` (``gen_ai.handoff.to_agent``/``from_agent``) or ``guardrail_check``
  (``gen_ai.guardrail.name``, ``gen_ai.guardrail.triggered``); its other spans are plain GenAI.
- OpenInference ``openinference-instrumentation-openai-agents``: a handoff is a TOOL span named
  ``handoff to <agent>``; agent spans are AGENT spans named after the agent. (That bridge does not
  export a guardrail's ``triggered`` flag; its guardrail spans are CHAIN spans.)
- Logfire's integration: span-data fields as attributes (``type`` = handoff with ``to_agent``;
  ``type`` = guardrail with ``name``/``triggered``); and ``logfire.instrument_openai_agents()``,
  which names each span after its message template and sends no ``type`` (pydantic/logfire
  ``tests/otel_integrations/test_openai_agents.py``): ``OpenAI Agents trace: {name}`` and
  ``Task: …`` → workflow; ``Agent run: {name!r}`` → agent (name from ``name``); ``Turn {turn} for
  agent …`` → a container, never a root; ``Function: {name}`` → tool (``input``/``output``,
  ``error``); ``Handoff: {from_agent} → {to_agent}``; ``Guardrail {name!r} {triggered=}``;
  ``Responses API with …`` / ``Chat completion with …`` → model call whose requested tool calls
  are the assistant ``tool_calls`` of its ``events`` attribute that no tool message there answers.

Handoff spans → ``Op.HANDOFF`` with ``handoff_target``; guardrail spans → ``Op.GUARDRAIL`` with
``guardrail_triggered`` (the dispatcher turns a trigger into decision ``refuse``).
"""

from __future__ import annotations

from typing import Any, Final

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan, Op

from ._values import as_bool, as_str, decode_json_once, first
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
_LF_TEMPLATE = _A["lf_template"][0]
_LF_TRACE = _A["lf_trace_name"][0]
_LF_TASK = _A["lf_task_prefix"][0]
_LF_AGENT = _A["lf_agent_name"][0]
_LF_TURN = _A["lf_turn_prefix"][0]
_LF_FUNCTION = _A["lf_function_name"][0]
_LF_HANDOFF = _A["lf_handoff_name"][0]
_LF_GUARDRAIL = _A["lf_guardrail_prefix"][0]
_LF_MODEL = _A["lf_model_prefixes"]
_LF_INPUT = _A["lf_input"][0]
_LF_OUTPUT = _A["lf_output"][0]
_LF_ERROR = _A["lf_error"][0]
_LF_EVENTS = _A["lf_events"][0]
_OI_KIND = CONVENTIONS["openinference"].attrs["span_kind"][0]


def _lf_template(span: CanonicalSpan) -> str | None:
    """The Logfire message template of a ``logfire.instrument_openai_agents`` span, else None."""
    t = span.attributes.get(_LF_TEMPLATE)
    if not isinstance(t, str) or t != span.name:
        return None
    if t in (_LF_TRACE, _LF_AGENT, _LF_FUNCTION, _LF_HANDOFF) or t.startswith(
            (_LF_TASK, _LF_TURN, _LF_GUARDRAIL, *_LF_MODEL)):
        return t
    return None


def _lf_requested(events: object) -> tuple[tuple[str, str | None, object], ...]:
    """(call id, tool name, arguments) of assistant tool calls in Logfire's ``events`` list that
    no later ``gen_ai.tool.message`` answers (the ones answered are input history)."""
    evs = decode_json_once(events)
    if not isinstance(evs, list):
        return ()
    answered = {e.get("id") for e in evs if isinstance(e, dict) and e.get("role") == "tool"}
    out: dict[str, tuple[str, str | None, object]] = {}
    for e in evs:
        if not isinstance(e, dict) or e.get("role") != "assistant":
            continue
        for c in e.get("tool_calls") or ():
            if not isinstance(c, dict):
                continue
            cid = as_str(c.get("id"))
            fn = c.get("function") if isinstance(c.get("function"), dict) else {}
            if cid and cid not in answered and cid not in out:
                out[cid] = (cid, as_str(fn.get("name")), decode_json_once(fn.get("arguments")))
    return tuple(out.values())


def _extract_lf(span: CanonicalSpan, t: str) -> dict[str, Any]:
    a = span.attributes
    out: dict[str, Any] = {}
    if t == _LF_TRACE or t.startswith(_LF_TASK):
        out["op"] = Op.WORKFLOW
    elif t == _LF_AGENT:
        out["op"] = Op.AGENT
        out["agent_name"] = as_str(a.get(_LF_NAME[0]))
    elif t.startswith(_LF_TURN):
        out["op"] = Op.UNKNOWN  # a turn of an agent run: a container, never a root
    elif t == _LF_FUNCTION:
        out["op"] = Op.TOOL
        out["tool_name"] = as_str(a.get(_LF_NAME[0]))
        out["tool_arguments"] = decode_json_once(a.get(_LF_INPUT))
        out["tool_result"] = decode_json_once(a.get(_LF_OUTPUT))
        err = decode_json_once(a.get(_LF_ERROR))
        if isinstance(err, dict) and err:
            out["error_type"] = as_str(err.get("message")) or "tool_error"
    elif t == _LF_HANDOFF:
        out["op"] = Op.HANDOFF
        out["handoff_target"] = as_str(first(a, _LF_TO))
    elif t.startswith(_LF_GUARDRAIL):
        out["op"] = Op.GUARDRAIL
        out["guardrail_triggered"] = as_bool(first(a, _LF_TRIGGERED))
    else:  # a model call: GenAI attributes carry the rest
        calls = _lf_requested(a.get(_LF_EVENTS))
        if calls:
            out["requested_tool_calls"] = tuple(c[0] for c in calls)
            out["requested_tools"] = calls
    return out


def detect(span: CanonicalSpan) -> bool:
    """True for a span of one of the OpenAI Agents bridges that this module refines."""
    a = span.attributes
    if _LF_TEMPLATE in a and _lf_template(span) is not None:
        return True
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
    lft = _lf_template(span) if _LF_TEMPLATE in a else None
    if lft is not None:
        return _extract_lf(span, lft)
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
