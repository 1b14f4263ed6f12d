"""Convention normalization: one decoded :class:`~relyscope.model.CanonicalSpan` in, one
:class:`~relyscope.model.SpanSemantics` out (conventions.md §3, style.md lessons 4–5).

One mapping module per source convention (:mod:`.genai`, :mod:`.openinference`,
:mod:`.openllmetry`, :mod:`.openai_agents`, :mod:`.adk`, :mod:`.pydantic_ai`, :mod:`.vercel_ai`,
:mod:`.genkit`, :mod:`.langfuse`, :mod:`.openlit`, :mod:`.semantic_kernel`) plus
:mod:`.relyscope` for the ``relyscope.*`` extension attributes, which apply on top of any
convention. Each exposes ``detect(span) -> bool`` (a few dict key checks) and
``extract(span) -> dict`` (SpanSemantics fields; None = not given). Attribute names live in the
versioned table :data:`.versions.CONVENTIONS`.

Merging: a span may carry several conventions at once (ADK emits GenAI + ``gcp.vertex.agent.*``
+ OpenInference). For each field the first non-None value in :data:`PRECEDENCE` order wins;
the op is the first specific (non-UNKNOWN) op in that order, else UNKNOWN when a convention said
so explicitly, else inferred (a tool name → TOOL; a model or token count → LLM), else UNKNOWN.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Final

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan, Evaluation, Op, SpanEvent, SpanSemantics

from . import (
    adk,
    genai,
    genkit,
    langfuse,
    openai_agents,
    openinference,
    openlit,
    openllmetry,
    pydantic_ai,
    semantic_kernel,
    vercel_ai,
)
from . import relyscope as relyscope_ext
from ._values import as_float, as_str
from .versions import CONVENTIONS, ConventionSpec

__all__ = [
    "normalize",
    "detect_conventions",
    "PRECEDENCE",
    "CONVENTIONS",
    "ConventionSpec",
]

#: Field precedence, highest first: relyscope.* on top; the OpenAI Agents refinement (handoff /
#: guardrail) over the GenAI ops it leaves unnamed; GenAI semconv over emitter-specific extras;
#: generic OpenInference / OpenLLMetry last.
PRECEDENCE: Final[tuple[ModuleType, ...]] = (
    relyscope_ext,
    openai_agents,
    genai,
    adk,
    pydantic_ai,
    vercel_ai,
    genkit,
    langfuse,
    openlit,
    semantic_kernel,
    openinference,
    openllmetry,
)

# The reported ``convention``: the most specific emitter detected.
_LABEL_ORDER: Final[tuple[ModuleType, ...]] = (
    openai_agents,
    adk,
    pydantic_ai,
    vercel_ai,
    genkit,
    langfuse,
    openlit,
    semantic_kernel,
    openllmetry,
    openinference,
    genai,
    relyscope_ext,
)

_EXCEPTION_EVENT: Final = "exception"
_EXCEPTION_TYPE: Final = "exception.type"
_SESSION_ID: Final = "session.id"
_MCP_TOOL_ERROR: Final = "tool_error"
#: Logfire's cost attribute (Claude Agent SDK / pydantic-ai through Logfire put it on the agent span)
_OPERATION_COST: Final = "operation.cost"
_G = CONVENTIONS["genai"].attrs
_EVAL_EVENT: Final = _G["evaluation_event"][0]
_EVAL_NAME: Final = _G["evaluation_name"][0]
_EVAL_SCORE: Final = _G["evaluation_score"][0]
_EVAL_LABEL: Final = _G["evaluation_label"][0]
_EVAL_EXPLANATION: Final = _G["evaluation_explanation"][0]


def detect_conventions(span: CanonicalSpan) -> tuple[str, ...]:
    """Names of the conventions present on ``span``, in :data:`PRECEDENCE` order."""
    return tuple(m.NAME for m in PRECEDENCE if m.detect(span))


def _error(span: CanonicalSpan) -> str | None:
    err = span.attributes.get(sc.ERROR_TYPE)
    if err is not None:  # (as_str(None) is None: skipped for the usual span without one)
        err = as_str(err)
        if err:
            return err
    if span.status_code == 2:
        return span.status_message or "error"
    for e in span.events:
        if e.name == _EXCEPTION_EVENT:
            return as_str(e.attributes.get(_EXCEPTION_TYPE)) or "exception"
    return None


def _evaluations(events: tuple[SpanEvent, ...]) -> tuple[Evaluation, ...]:
    out = []
    for e in events:
        if e.name != _EVAL_EVENT:
            continue
        ea = e.attributes
        out.append(
            Evaluation(
                name=as_str(ea.get(_EVAL_NAME)) or "",
                score=as_float(ea.get(_EVAL_SCORE)),
                label=as_str(ea.get(_EVAL_LABEL)),
                explanation=as_str(ea.get(_EVAL_EXPLANATION)),
            )
        )
    return tuple(out)


def _complete(span: CanonicalSpan, fields: dict[str, Any], op: Op | None, said_unknown: bool) -> Op:
    """What every convention's fields share once gathered: the op when no convention named it,
    the error type (an MCP ``isError`` result included), session id, cost, evaluations, a
    guardrail's decision and total tokens. Fills ``fields`` in place; returns the op. Shared by
    the oracle and the fast normalizer (:mod:`relyscope.collector.normalize.fast`)."""
    if op is None:
        if said_unknown:
            op = Op.UNKNOWN
        elif "tool_name" in fields:
            op = Op.TOOL
        elif "model" in fields or "input_tokens" in fields or "output_tokens" in fields:
            op = Op.LLM
        else:
            op = Op.UNKNOWN

    err = _error(span)
    if err is not None:
        fields["error_type"] = err
    elif op is Op.TOOL:
        result = fields.get("tool_result")
        if isinstance(result, dict) and result.get("isError") is True:
            fields["error_type"] = _MCP_TOOL_ERROR  # an MCP CallToolResult reporting failure
    a = span.attributes
    if "conversation_id" not in fields:
        sid = a.get(_SESSION_ID)
        if sid is not None:  # as_str / as_float map None to None: not called for absent keys
            sid = as_str(sid)
            if sid:
                fields["conversation_id"] = sid
    if "cost_usd" not in fields:
        cost = a.get(_OPERATION_COST)
        if cost is not None:
            cost = as_float(cost)
            if cost is not None and cost >= 0:
                fields["cost_usd"] = cost
    if span.events:
        evaluations = _evaluations(span.events)
        if evaluations:
            fields["evaluations"] = evaluations
    if fields.get("guardrail_triggered") is True and "decision" not in fields:
        fields["decision"] = "refuse"
    if "total_tokens" not in fields and "input_tokens" in fields and "output_tokens" in fields:
        fields["total_tokens"] = fields["input_tokens"] + fields["output_tokens"]
    return op


def _normalize(span: CanonicalSpan) -> SpanSemantics:
    fields: dict[str, Any] = {}
    op: Op | None = None
    said_unknown = False
    detected = [m for m in PRECEDENCE if m.detect(span)]
    for m in detected:
        part = m.extract(span)
        mop = part.pop("op", None)
        if mop is Op.UNKNOWN:
            said_unknown = True
        elif mop is not None and op is None:
            op = mop
        for k, v in part.items():
            if v is not None and k not in fields:
                fields[k] = v

    op = _complete(span, fields, op, said_unknown)

    label = "unknown"
    for m in _LABEL_ORDER:
        if m in detected:
            label = m.NAME
            break
    return SpanSemantics(op=op, convention=label, **fields)


def normalize(span: CanonicalSpan) -> SpanSemantics:
    """Map one canonical span to its meaning for scoring, whatever convention it came in.

    Returns a :class:`SpanSemantics`; tokens are counts, ``cost_usd`` USD, ``confidence`` and
    ``outcome_score`` in [0, 1] (else None); JSON-string tool arguments/results are decoded once.
    Agent name/version are NOT defaulted from the resource here (the trajectory builder does
    that). Never raises: a span that cannot be mapped becomes ``SpanSemantics()`` (op UNKNOWN).
    Pure and thread-safe; a bounded number of dict lookups per span (plus one pass over the keys
    of OpenInference model-call spans).
    """
    try:
        return _normalize(span)
    except Exception:  # never crash on bad input: the span is kept and ignored as UNKNOWN
        return SpanSemantics()
