"""The hot-path normalizer: :func:`normalize_fast` gives exactly what :func:`~relyscope.collector.
normalize.normalize` gives, through precomputed key tables instead of twelve ``detect`` calls and
one ``first()`` lookup per field name.

Most agent traffic carries only GenAI semconv and ``relyscope.*`` attributes. For such a span the
result is computed here in one pass over its attributes: each key is looked up once in a table
``key → (field, priority)`` built from :data:`~.versions.CONVENTIONS` at import time. A span that
could match any other convention — one of the keys, attribute values, scopes or resources any
other ``detect`` reads (:data:`OTHER_KEYS`, :func:`_scope_is_plain`), or legacy GenAI message
events — goes through the full :func:`~relyscope.collector.normalize.normalize` (the oracle), so the
result is equal on every input (``tests/test_fastpath.py`` checks both on every recorded payload
and on every attribute name of every convention table).

Pure and thread-safe; never raises (as the oracle).
"""

from __future__ import annotations

from typing import Any, Final

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan, Op, SpanSemantics

from . import (
    _complete,
    adk,
    genai,
    genkit,
    langfuse,
    normalize,
    openai_agents,
    openinference,
    openlit,
    openllmetry,
    pydantic_ai,
    vercel_ai,
)
from . import semantic_kernel
from . import relyscope as rs
from ._values import (
    as_bool,
    as_enum,
    as_int,
    as_outcome,
    as_str,
    as_str_tuple,
    as_unit,
    decode_json_once,
    first_user_text,
)
from .versions import CONVENTIONS

__all__ = ["normalize_fast", "OTHER_KEYS"]

_G = CONVENTIONS["genai"].attrs
_R = CONVENTIONS["relyscope"].attrs

#: Attribute keys any convention other than GenAI and relyscope.* tests in its ``detect`` (by
#: presence or by value): a span holding one is normalized by the oracle.
OTHER_KEYS: Final[frozenset[str]] = frozenset(
    adk._MARKERS + (sc.GEN_AI_SYSTEM,)
    + (genkit._TYPE, genkit._NAME[0])
    + (langfuse._TYPE,)
    + (openai_agents._LF_TEMPLATE, openai_agents._HANDOFF_TO[0], openai_agents._GUARDRAIL_TRIGGERED[0],
       openai_agents._LF_TYPE)
    + (openinference._KIND,)
    + (openlit._COST[0],)
    + tuple(openllmetry._MARKERS)
    + tuple(pydantic_ai._LOGFIRE)
    + (vercel_ai._OPERATION_ID, vercel_ai._TOOL_NAME[0])
)
_OTHER_OPS: Final = frozenset((openai_agents._OP_HANDOFF, openai_agents._OP_GUARDRAIL))
_LEGACY_EVENTS: Final = frozenset((genai._USER_EVENT, genai._CHOICE_EVENT))
_OPERATION: Final = genai._OPERATION[0]

# field of GenAI semconv -> priority-ordered names; a key of several fields keeps them all
_GENAI_FIELDS: Final = ("provider", "agent_name", "agent_id", "agent_version", "conversation_id",
                        "is_nested", "request_model", "response_model", "finish_reasons",
                        "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                        "reasoning_tokens", "total_tokens", "tool_name", "tool_call_id", "tool_type",
                        "tool_arguments", "tool_result", "input_messages", "output_messages")
_RS_FIELDS: Final = tuple(_R)


def _table(spec, fields) -> dict[str, tuple[tuple[str, int], ...]]:
    out: dict[str, list] = {}
    for f in fields:
        for prio, k in enumerate(spec[f]):
            out.setdefault(k, []).append((f, prio))
    return {k: tuple(v) for k, v in out.items()}


_GENAI_TABLE: Final = _table(_G, _GENAI_FIELDS)
_RS_TABLE: Final = _table(_R, _RS_FIELDS)
#: key -> (is genai marker, table entries) for every key the fast path reads
_GENAI_MARKERS: Final = frozenset(genai._MARKERS)
_RS_KEYS: Final = frozenset(rs._ALL_KEYS)

_scope_cache: dict[tuple[str, Any], bool] = {}


def _scope_is_plain(span: CanonicalSpan) -> bool:
    """False when the span's scope or resource alone could make another convention detect it
    (OpenAI Agents' OpenInference scope, pydantic-ai's scope, Semantic Kernel's scope prefix,
    OpenLIT's scope or SDK). Cached per (scope, SDK name): one dict lookup per span."""
    sdk = span.resource.get("telemetry.sdk.name")
    key = (span.scope_name, sdk if isinstance(sdk, str) else repr(sdk))
    hit = _scope_cache.get(key)
    if hit is None:
        s = span.scope_name
        hit = not (s == openai_agents._OI_SCOPE or s == pydantic_ai._SCOPE
                   or s.startswith(semantic_kernel._SCOPE_PREFIX) or s.startswith(openlit._SDK_NAME)
                   or sdk == openlit._SDK_NAME)
        if len(_scope_cache) < 4096:
            _scope_cache[key] = hit
    return hit


def _pick(a, table) -> dict[str, Any]:
    """field -> the value of its first name (priority order) that is present and not None/""
    (:func:`~._values.first` for every field at once)."""
    found: dict[str, tuple[int, Any]] = {}
    for k, v in a.items():
        ents = table.get(k)
        if ents is None or v is None or v == "":
            continue
        for f, prio in ents:
            cur = found.get(f)
            if cur is None or prio < cur[0]:
                found[f] = (prio, v)
    return {f: pv[1] for f, pv in found.items()}


#: GenAI fields converted one to one: field -> (SpanSemantics field, converter). Every converter
#: maps None to None, so an absent field is simply not looked at.
_GENAI_CONV: Final = {
    "agent_name": as_str, "agent_id": as_str, "agent_version": as_str, "is_nested": as_bool,
    "conversation_id": as_str, "provider": as_str, "tool_name": as_str, "tool_call_id": as_str,
    "tool_type": as_str, "tool_arguments": decode_json_once, "tool_result": decode_json_once,
    "input_tokens": as_int, "output_tokens": as_int, "cache_read_tokens": as_int,
    "cache_write_tokens": as_int, "reasoning_tokens": as_int, "total_tokens": as_int,
}


_NO_OP: Final = object()  # "not a GenAI operation name" in _op_cache
_op_cache: dict[str, Any] = {}  # gen_ai.operation.name as sent -> Op (or _NO_OP)


def _genai(span: CanonicalSpan) -> dict[str, Any]:
    """:func:`~.genai.extract` for a span with no legacy message events (same fields, same
    order of precedence; fields it would give as None are left out)."""
    a = span.attributes
    p = _pick(a, _GENAI_TABLE)
    out: dict[str, Any] = {}
    op_name = a.get(_OPERATION)
    if isinstance(op_name, str):
        op = _op_cache.get(op_name)
        if op is None:
            op = genai.OPERATIONS.get(op_name.strip().lower(), _NO_OP)
            if len(_op_cache) < 1024:  # bounded: operation names are a small vocabulary
                _op_cache[op_name] = op
        if op is not _NO_OP:
            out["op"] = op
    conv = _GENAI_CONV
    for f, v in p.items():
        c = conv.get(f)
        if c is not None:
            out[f] = c(v)
    g = p.get
    if "response_model" in p or "request_model" in p:
        out["model"] = as_str(g("response_model")) or as_str(g("request_model"))
    fin = g("finish_reasons")
    finish = as_str_tuple(fin) if fin is not None else ()
    in_msgs = g("input_messages")
    if in_msgs is not None:
        out["first_user_input"] = first_user_text(in_msgs)
    out_msgs = g("output_messages")
    if out_msgs is not None:
        requested, calls, finish = genai.output_message_fields(out_msgs, finish)
        if calls:
            out["requested_tools"] = calls
        if finish:
            out["finish_reasons"] = finish
        if requested:
            out["requested_tool_calls"] = requested
    elif finish:
        out["finish_reasons"] = finish
    return out


def _relyscope(span: CanonicalSpan) -> dict[str, Any]:
    """:func:`~.relyscope.extract`, fields absent from the span skipped (they would be None)."""
    p = _pick(span.attributes, _RS_TABLE)
    out: dict[str, Any] = {}
    for f, v in p.items():
        conv = _RS_CONV[f]
        out[_RS_OUT.get(f, f)] = conv(v)
    return out


_RS_CONV: Final = {
    "task_id": as_str, "trial_id": as_str,
    "run_kind": lambda v: as_enum(v, sc.RUN_KINDS), "outcome": as_outcome,
    "outcome_score": as_unit, "outcome_source": as_str, "claimed_success": as_bool,
    "confidence": as_unit, "decision": lambda v: as_enum(v, sc.DECISIONS),
    "side_effect": lambda v: as_enum(v, sc.SIDE_EFFECTS), "shadow_of": as_str,
    "perturbation_family": lambda v: as_enum(v, sc.PERTURBATION_FAMILIES),
    "perturbation_strength": as_str, "fault_type": as_str, "trial_separate": as_bool,
}
_RS_OUT: Final = {"trial_separate": "separate_trial"}
assert set(_RS_CONV) == set(_R), "relyscope.* table and fast converters disagree"



def _fast(span: CanonicalSpan) -> SpanSemantics | None:
    a = span.attributes
    if not _scope_is_plain(span) or not OTHER_KEYS.isdisjoint(a) or a.get(_OPERATION) in _OTHER_OPS:
        return None
    for e in span.events:
        if e.name in _LEGACY_EVENTS:
            return None
    has_rs = not _RS_KEYS.isdisjoint(a)
    has_g = not _GENAI_MARKERS.isdisjoint(a)
    fields: dict[str, Any] = {}
    op: Op | None = None
    said_unknown = False
    # PRECEDENCE order: relyscope.* first, then GenAI (the only two detected here)
    if has_rs:
        for k, v in _relyscope(span).items():
            if v is not None:
                fields[k] = v
    if has_g:
        part = _genai(span)
        mop = part.pop("op", None)
        if mop is Op.UNKNOWN:
            said_unknown = True
        elif mop is not None:
            op = mop
        for k, v in part.items():
            if v is not None and k not in fields:
                fields[k] = v
    op = _complete(span, fields, op, said_unknown)
    label = genai.NAME if has_g else (rs.NAME if has_rs else "unknown")
    return SpanSemantics(op=op, convention=label, **fields)


def normalize_fast(span: CanonicalSpan) -> SpanSemantics:
    """Equal to :func:`~relyscope.collector.normalize.normalize` on every span (module docstring);
    a bounded number of dict lookups per attribute of the span."""
    try:
        out = _fast(span)
    except Exception:  # noqa: BLE001 - the oracle decides what a failure maps to
        out = None
    return normalize(span) if out is None else out
