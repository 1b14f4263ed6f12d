"""Microsoft Semantic Kernel 1.55+: GenAI semconv with messages in span events (read by
:mod:`.genai`) and its own operation names (``chat.completions``, ``text.completions``); a span of
its scope with only a response/request model is a model call."""

from __future__ import annotations

from typing import Any, Final

from relyscope import semconv as sc
from relyscope.model import CanonicalSpan, Op

from .versions import CONVENTIONS

__all__ = ["NAME", "detect", "extract"]

NAME: Final = "semantic_kernel"
_A = CONVENTIONS[NAME].attrs

_SCOPE_PREFIX = _A["scope_prefix"][0]
_LLM_OPERATIONS = frozenset(_A["llm_operations"])


def detect(span: CanonicalSpan) -> bool:
    """True for spans of a ``Microsoft.SemanticKernel*`` instrumentation scope."""
    return span.scope_name.startswith(_SCOPE_PREFIX)


def extract(span: CanonicalSpan) -> dict[str, Any]:
    """The Op of a Semantic Kernel span when GenAI's operation names do not give it."""
    a = span.attributes
    op_name = a.get(sc.GEN_AI_OPERATION_NAME)
    if op_name in _LLM_OPERATIONS:
        return {"op": Op.LLM}
    if op_name is None and (sc.GEN_AI_RESPONSE_MODEL in a or sc.GEN_AI_REQUEST_MODEL in a):
        return {"op": Op.LLM}
    return {}
